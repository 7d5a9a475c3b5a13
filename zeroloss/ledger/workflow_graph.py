"""A workflow's shape as sent (docs/workflows.md): its steps, their names and dependencies, checked
before anything is stored."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import InvalidWorkflow
from .validation import canonical_json, checksum_text

#: ``on_upstream_failure`` values: what a step does when a dependency ends dead or cancelled.
POLICIES = ("wait", "cancel", "run")


@dataclass(frozen=True)
class StepSpec:
    """One step as sent: an ordinary message of its queue, and the names of the steps it waits for."""

    name: str
    queue_name: str
    data: Any
    after: tuple[str, ...] = ()
    max_attempts: int | None = None
    priority: int = 0
    ordering_key: str = ""
    headers: dict[str, Any] | None = None
    on_upstream_failure: str = "wait"


@dataclass
class StoredWorkflow:
    """What sending a workflow stored (or found stored: ``created`` False)."""

    workflow_id: str
    created: bool
    #: Each step's message id, by step name.
    message_ids: dict[str, str] = field(default_factory=dict)


def step_message_id(workflow_id: str, name: str) -> str:
    return f"{workflow_id}/{name}"


def fingerprint(steps: Sequence[StepSpec]) -> str:
    """What makes two sends of a workflow the same: each step's payload as a message's checksum
    compares it (numbers by value: ``1.0`` and ``1`` are one payload), and its shape."""
    shape = [
        [
            s.name,
            s.queue_name,
            checksum_text(canonical_json(s.data)),
            sorted(s.after),
            s.priority,
            s.ordering_key,
            s.on_upstream_failure,
        ]
        for s in steps
    ]
    return hashlib.sha256(canonical_json(shape).encode()).hexdigest()


def check_graph(workflow_id: str, steps: Sequence[StepSpec]) -> None:
    """Names unique, dependencies known, policies known, no cycle; else :class:`InvalidWorkflow`."""
    if not steps:
        raise InvalidWorkflow(f"Workflow {workflow_id!r} has no step: add one with flow.step(...).")
    names = [s.name for s in steps]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidWorkflow(f"Workflow {workflow_id!r} has two steps named {name!r}: name each once.")
        seen.add(name)
    for s in steps:
        if s.on_upstream_failure not in POLICIES:
            raise InvalidWorkflow(
                f"Step {s.name!r}: on_upstream_failure must be one of {', '.join(POLICIES)}, "
                f"got {s.on_upstream_failure!r}."
            )
        unknown = [a for a in s.after if a not in seen]
        if unknown:
            raise InvalidWorkflow(
                f"Step {s.name!r} of workflow {workflow_id!r} waits for {unknown[0]!r}, which is not a step "
                f"of it (its steps: {', '.join(sorted(seen)[:10])}). Nothing was stored."
            )
        if s.name in s.after:
            raise InvalidWorkflow(f"Step {s.name!r} waits for itself: a cycle. Nothing was stored.")
    # Kahn's order: whatever is left has a cycle.
    waits = {s.name: set(s.after) for s in steps}
    dependents: dict[str, list[str]] = defaultdict(list)
    for s in steps:
        for a in s.after:
            dependents[a].append(s.name)
    ready = [n for n, w in waits.items() if not w]
    done = 0
    while ready:
        n = ready.pop()
        done += 1
        for d in dependents[n]:
            waits[d].discard(n)
            if not waits[d]:
                ready.append(d)
    if done < len(steps):
        cycle = sorted(n for n, w in waits.items() if w)
        raise InvalidWorkflow(
            f"Workflow {workflow_id!r} has a cycle among {', '.join(cycle[:10])}: a step cannot wait, "
            "directly or not, for itself. Nothing was stored."
        )
