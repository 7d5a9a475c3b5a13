"""One workflow as an operator sees it: ``zeroloss_status --workflow ID`` and the admin's workflow
page read this one report, so they always agree (docs/workflows.md, "Operating a workflow").

:func:`workflow_report` reads the workflow's steps and dependencies (two statements over the
workflow-id indexes: its cost follows the workflow's size, never the ledger's) and works out:

- each step's **level**: 0 for a step that waits for nothing, else one more than the deepest of
  its dependencies (its topological depth), so a page can list the steps as they run;
- what each step **waits for**: its dependencies not yet settled (by name);
- what **blocks** it: the dead steps it waits for, directly or through other waiting steps. A
  dead step keeps its dependents waiting under ``on_upstream_failure="wait"`` until a redrive
  completes it; the report names those dead steps and their last errors (:class:`Blocker`).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..core.states import FINISHED_STATUSES, LIVE_STATUSES, Status
from ..exceptions import WorkflowNotFound
from ..ledger.service import ZeroLossMessageService
from ..ledger.workflow_models import Workflow
from ..ledger.workflows import StepRow

#: A workflow's overall state: every step finished; a dead step holds dependents; still going.
FINISHED, BLOCKED, RUNNING = "finished", "blocked", "running"


@dataclass(frozen=True)
class StepLine:
    """One step: its row, its level, what it waits for and what blocks it (step names)."""

    step: StepRow
    level: int
    #: Every step it waits for, settled or not.
    after: tuple[str, ...]
    #: Its dependencies not yet settled (their outcome has not released it).
    waits_for: tuple[str, ...]
    #: The dead steps it waits for, directly or through other waiting steps.
    blocked_by: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.step.name

    def as_dict(self) -> dict[str, Any]:
        s = self.step
        return {
            "name": s.name,
            "message_id": s.message_id,
            "queue": s.queue_name,
            "status": s.status,
            "level": self.level,
            "attempts": s.attempts,
            "max_attempts": s.max_attempts,
            "result": s.result,
            "last_error": s.last_error,
            "on_upstream_failure": s.on_upstream_failure,
            "after": list(self.after),
            "waits_for": list(self.waits_for),
            "blocked_by": list(self.blocked_by),
        }


@dataclass(frozen=True)
class Blocker:
    """A dead step that holds waiting steps: a redrive that completes it releases them."""

    name: str
    message_id: str
    last_error: str
    #: The waiting steps it holds (directly or through other waiting steps), by name.
    holds: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "message_id": self.message_id,
            "last_error": self.last_error,
            "holds": list(self.holds),
        }


@dataclass(frozen=True)
class WorkflowReport:
    workflow_id: str
    created_at: dt.datetime | None
    #: In level order, then in the order they were stored.
    steps: list[StepLine]
    blockers: list[Blocker]

    @property
    def counts(self) -> dict[str, int]:
        seen = Counter(line.step.status for line in self.steps)
        return {s: seen.get(s, 0) for s in Status.values}

    @property
    def state(self) -> str:
        if all(line.step.status in FINISHED_STATUSES for line in self.steps):
            return FINISHED
        return BLOCKED if self.blockers else RUNNING

    @property
    def finished_steps(self) -> int:
        return sum(line.step.status in FINISHED_STATUSES for line in self.steps)

    @property
    def dead(self) -> list[StepLine]:
        return [line for line in self.steps if line.step.status == Status.DEAD]

    @property
    def live(self) -> list[StepLine]:
        return [line for line in self.steps if line.step.status in LIVE_STATUSES]

    def levels(self) -> list[tuple[int, list[StepLine]]]:
        """The steps grouped by level, lowest first."""
        out: list[tuple[int, list[StepLine]]] = []
        for line in self.steps:
            if not out or out[-1][0] != line.level:
                out.append((line.level, []))
            out[-1][1].append(line)
        return out

    def as_dict(self) -> dict[str, Any]:
        """The JSON document of ``zeroloss_status --workflow ID --json`` (docs/operations.md)."""
        return {
            "workflow_id": self.workflow_id,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "state": self.state,
            "steps_total": len(self.steps),
            "steps_finished": self.finished_steps,
            "counts": self.counts,
            "blocked": [b.as_dict() for b in self.blockers],
            "steps": [line.as_dict() for line in self.steps],
        }


def _levels(steps: list[StepRow]) -> dict[str, int]:
    """Each step's topological depth, by message id (a workflow's graph has no cycle: checked
    when it was stored)."""
    known = {s.message_id for s in steps}
    after = {s.message_id: [u for u in s.after if u in known] for s in steps}
    level: dict[str, int] = {}
    for s in steps:
        stack = [s.message_id]
        while stack:
            mid = stack[-1]
            if mid in level:
                stack.pop()
                continue
            todo = [u for u in after[mid] if u not in level]
            if todo:
                stack.extend(todo)
                continue
            level[mid] = 1 + max((level[u] for u in after[mid]), default=-1)
            stack.pop()
    return level


def workflow_report(service: ZeroLossMessageService, workflow_id: str) -> WorkflowReport:
    """The workflow's report; :class:`~zeroloss.exceptions.WorkflowNotFound` when no workflow or
    no step of it is in the ledger."""
    rows = service.workflows.steps(workflow_id)
    stored = Workflow.objects.using(service.using).filter(workflow_id=workflow_id).first()
    if not rows:
        raise WorkflowNotFound(workflow_id)
    by_id = {s.message_id: s for s in rows}
    level = _levels(rows)
    order = sorted(rows, key=lambda s: level[s.message_id])  # stable: stored order within a level
    blocked: dict[str, tuple[str, ...]] = {}
    for s in order:  # a step's dependencies come before it
        found: dict[str, None] = {}
        if s.status == Status.WAITING:
            for up in s.unsettled:
                u = by_id.get(up)
                if u is None:
                    continue
                if u.status == Status.DEAD:
                    found[u.name] = None
                else:
                    found.update(dict.fromkeys(blocked.get(up, ())))
        blocked[s.message_id] = tuple(found)
    names = {mid: s.name for mid, s in by_id.items()}
    lines = []
    for s in order:
        line = StepLine(
            step=s,
            level=level[s.message_id],
            after=tuple(names.get(u, u) for u in s.after),
            waits_for=tuple(names.get(u, u) for u in s.unsettled),
            blocked_by=blocked[s.message_id],
        )
        lines.append(line)
    holds: dict[str, list[str]] = {}
    for line in lines:
        for b in line.blocked_by:
            holds.setdefault(b, []).append(line.name)
    blockers = [
        Blocker(line.name, line.step.message_id, line.step.last_error, tuple(holds[line.name]))
        for line in lines
        if line.name in holds
    ]
    return WorkflowReport(
        workflow_id=workflow_id,
        created_at=stored.created_at if stored is not None else None,
        steps=lines,
        blockers=blockers,
    )
