"""Retention of workflows (docs/workflows.md#retention): a workflow goes whole or not at all.

The purges by status skip workflow steps, and a period holding a step is never dropped
(``statements_partitions.HOLDS_KEPT``): a step of an unfinished workflow must stay (its result
is what its dependents read; a redrive of its dead sibling may still need it), and a finished
workflow must not be left with some steps gone. Here, a finished workflow (every step finished)
goes once each of its steps is past the retention of its status and queue: its steps with their
audit rows and keys, its dependencies, its fan-in rows and its own row, in one transaction,
counted into :class:`~zeroloss.ledger.models.PurgeRecord` rows as any purge. Statements:
``sql/workflows.sql`` (and the purge's own, ``sql/ops.sql``).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from django.db import transaction

from ..core.states import FINISHED_STATUSES
from . import statements_ops
from .base import Part
from .models import PurgeRecord

#: How long a step of ``(queue, status)`` is kept once finished, in seconds (None: for ever).
AgeOf = Callable[[str, str], "float | None"]
_FINISHED = frozenset(s.value for s in FINISHED_STATUSES)


def purge_workflows(
    part: Part,
    age_of: AgeOf,
    *,
    shortest: float,
    actor: str,
    batch_size: int,
    deadline: float | None = None,
    limit: int | None = None,
) -> dict[str, int]:
    """Every finished workflow whose steps are all past ``age_of`` deleted whole; the steps
    removed, by status. ``shortest``: the shortest age ``age_of`` gives (a workflow with a step
    finished more recently is not read). Pages of ``batch_size`` workflows (at most ``limit``),
    each page's purge one transaction, however many steps its workflows have; stops starting
    pages at ``deadline`` (monotonic) or once ``limit`` steps went."""
    engine, conn = part.engine, part.connection
    removed: Counter[str] = Counter()
    after = 0
    while limit is None or sum(removed.values()) < limit:
        size = batch_size if limit is None else min(batch_size, limit - sum(removed.values()))
        rows, _ = part.ctx.run("WORKFLOW_PURGE_CANDIDATES", {"after": after, "age": -shortest, "size": size})
        if not rows:
            break
        after = rows[-1][0]
        with transaction.atomic(using=part.using):
            steps, _ = part.ctx.run("WORKFLOW_PURGE_STEPS", {"wf": engine.column(r[1] for r in rows)})
            by_workflow: dict[str, list[Any]] = defaultdict(list)
            for step in steps:
                by_workflow[step[1]].append(step)
            going = [r[1] for r in rows if all(_expired(age_of, s) for s in by_workflow[r[1]])]
            ids = [s[0] for w in going for s in by_workflow[w]]
            if going:
                if ids:
                    column = {"ids": engine.column(ids)}
                    for name in ("PURGE_EVENTS", "PURGE_KEYS", "PURGE_MESSAGES"):
                        engine.run(conn, statements_ops, name, column)
                    part.ctx.run("FANIN_PURGE", column)
                wf = {"wf": engine.column(going)}
                part.ctx.run("DEPENDENCY_PURGE", wf)
                part.ctx.run("WORKFLOW_PURGE", wf)
                counts = Counter((s[2], s[3]) for w in going for s in by_workflow[w])
                now = part.database_now()
                PurgeRecord.objects.using(part.using).bulk_create(
                    [
                        PurgeRecord(queue_name=q, status=st, count=n, actor=actor, purged_at=now)
                        for (q, st), n in sorted(counts.items())
                    ]
                )
                for (_, st), n in counts.items():
                    removed[st] += n
        if len(rows) < size or (deadline is not None and time.monotonic() >= deadline):
            break
    return dict(removed)


def _expired(age_of: AgeOf, step: Any) -> bool:
    """A step (its :data:`WORKFLOW_PURGE_STEPS` row) finished longer ago than its retention."""
    _, _, queue, status, finished_for = step
    if status not in _FINISHED:
        return False  # redriven since the candidates were read: the workflow is live again
    age = age_of(queue, status)
    return age is not None and float(finished_for) >= age
