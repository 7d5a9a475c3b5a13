"""Workflows in the ledger (docs/workflows.md): storing a workflow's steps and dependencies in the
caller's transaction, and settling a step's dependents in the transaction of its outcome.

Statements: ``sql/workflows.sql``. Who calls :meth:`Workflows.settle`: the outcomes of a lease
holder (:mod:`.outcomes`), the sweep (:mod:`.sweep`) and the operator's moves (:mod:`.operator`),
each after its own fenced statement, in its transaction, with the messages that statement moved.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from ..core.states import FINISHED_STATUSES, Status
from ..exceptions import InvalidWorkflow, MessageConflict, WorkflowConflict
from .base import Part
from .models import Message
from .validation import validate_message_id
from .workflow_graph import StepSpec, StoredWorkflow, check_graph, fingerprint, step_message_id
from .workflow_models import fanin_group, fanin_groups

_COMPLETED = Status.COMPLETED.value
_ENDED = frozenset(s.value for s in FINISHED_STATUSES)


class Workflows(Part):
    """A workflow's steps stored whole; their dependents released or cancelled by outcomes."""

    def store(
        self, workflow_id: str, steps: Sequence[StepSpec], *, actor: str | None = None
    ) -> StoredWorkflow:
        """Store a workflow's steps and dependencies, all or nothing, in the caller's transaction
        (or one of its own). The same id again: the stored workflow when its steps are the same,
        else :class:`WorkflowConflict`."""
        workflow_id = validate_message_id(workflow_id, "workflow id")
        check_graph(workflow_id, steps)
        print_ = fingerprint(steps)
        ids = {s.name: step_message_id(workflow_id, s.name) for s in steps}
        actor = actor or self.instance_id
        with transaction.atomic(using=self.using):
            rows, _ = self._run(
                "WORKFLOW_INSERT", {"wf": workflow_id, "fingerprint": print_, "steps": len(steps)}
            )
            if not rows:
                stored = self._run("WORKFLOW_OF", {"wf": workflow_id})[0]
                if stored and stored[0][0] == print_:
                    return StoredWorkflow(workflow_id, False, ids)
                detail = f"{stored[0][1]} other steps" if stored else "other steps"
                raise WorkflowConflict(workflow_id, detail)
            self._insert(workflow_id, steps, {}, actor)
        return StoredWorkflow(workflow_id, True, ids)

    def _insert(
        self, workflow_id: str, steps: Sequence[StepSpec], known: dict[str, str], actor: str
    ) -> dict[str, str]:
        """Insert steps (in the caller's transaction) and their dependencies, on the new steps or
        on ``known`` ones (name -> message id). Returns every new step's message id by name."""
        ids = {s.name: step_message_id(workflow_id, s.name) for s in steps}
        for mid in ids.values():
            validate_message_id(mid, "step's message id (workflow id/step name)")
        prepared = [
            self.ctx.store._prepare(
                ids[s.name], s.queue_name, s.data, s.max_attempts, s.priority, s.ordering_key, s.headers
            )
            for s in steps
        ]
        self.ctx.store.period_ready()
        engine = self.engine
        conflict = "another message: a step's id is its workflow's id, a slash and its name"
        if "STEP_KEYS" in engine.sql:
            taken = {r[0] for r in self._run("STEP_KEYS", {"mid": list(ids.values())})[0]}
            if len(taken) < len(ids):
                raise MessageConflict(next(m for m in ids.values() if m not in taken), conflict)
        params = engine.batch(
            mid=[p.message_id for p in prepared],
            q=[p.queue_name for p in prepared],
            payload=[p.encoded for p in prepared],
            checksum=[p.checksum for p in prepared],
            max_attempts=[p.max_attempts for p in prepared],
            priority=[p.priority for p in prepared],
            k=[p.ordering_key for p in prepared],
            headers=[p.headers for p in prepared],
            name=[s.name for s in steps],
            waiting_on=[fanin_groups(len(s.after)) if s.after else 0 for s in steps],
            policy=[s.on_upstream_failure for s in steps],
            status=[(Status.WAITING if s.after else Status.PENDING).value for s in steps],
        )
        with transaction.atomic(
            using=self.using
        ):  # a savepoint: a conflict leaves the caller's transaction usable
            try:
                moved = self._move("STEP_INSERT", {**params, "wf": workflow_id}, actor=actor, detail="")
            except IntegrityError as exc:
                raise MessageConflict(next(iter(ids.values())), conflict) from exc
        pk = {r[1]: r[0] for r in moved}
        every = {**known, **ids}
        down: list[int] = []
        up: list[str] = []
        group: list[int] = []
        fan: Counter[tuple[int, int]] = Counter()
        for s in steps:
            groups = fanin_groups(len(s.after))
            for n, a in enumerate(s.after):
                d = pk[ids[s.name]]
                down.append(d)
                up.append(every[a])
                group.append(fanin_group(n, groups))
                fan[(d, fanin_group(n, groups))] += 1
        if down:
            self._run("DEPENDENCY_INSERT", {**engine.batch(down=down, up=up, fanin=group), "wf": workflow_id})
            keys = sorted(fan)
            self._run(
                "FANIN_INSERT",
                engine.batch(down=[k[0] for k in keys], fanin=[k[1] for k in keys], n=[fan[k] for k in keys]),
            )
        roots = [p for p, s in zip(prepared, steps, strict=True) if not s.after]
        keyed = {(p.queue_name, p.ordering_key) for p in roots if p.ordering_key}
        if keyed:
            self.promote_keys(keyed)
        if roots and engine.has_listen_notify:
            engine.wake(self.connection, sorted({p.queue_name for p in roots}))
        # PERSISTENCE_LEVEL "replicated": confirmed as a send's are, once the transaction commits.
        self.ctx.store.confirm_replicated([Message(pk=pk[mid], message_id=mid) for mid in ids.values()])
        return ids

    # -- settling dependents ---------------------------------------------------------------

    def settle(self, ended: Iterable[tuple[str, str]]) -> list[str]:
        """In the transaction of the outcomes that ended these steps (``(message id, status)``,
        as their fenced statements moved them): settle their dependents' edges once, release the
        dependents left waiting on nothing, cancel those whose policy says so (and so on down).
        Returns the message ids released."""
        todo = [(mid, st) for mid, st in ended if st in _ENDED]
        released: list[str] = []
        engine = self.engine
        while todo:
            if all(st == _COMPLETED for _, st in todo):
                rows, _ = self._run(
                    "SETTLE_COMPLETED", {"up": engine.column(m for m, _ in todo)}, prepare=True
                )
            else:
                rows, _ = self._run(
                    "SETTLE", engine.batch(up=[m for m, _ in todo], status=[s for _, s in todo])
                )
            todo = []
            if not rows:
                break
            failed = sorted({r[0] for r in rows if r[2] != _COMPLETED})
            policy: dict[int, str] = {}
            if failed:
                policy = dict(self._run("STEP_POLICIES", {"ids": engine.column(failed)})[0])
            counted: Counter[tuple[int, int]] = Counter()
            to_cancel: set[int] = set()
            for down, group, st in rows:
                if st == _COMPLETED or policy.get(down) == "run":
                    counted[(down, group)] += 1
                else:
                    to_cancel.add(down)
            if counted:
                released.extend(self._count(counted))
            if to_cancel:
                cancelled = self._move(
                    "STEP_CANCEL",
                    {"ids": engine.column(sorted(to_cancel))},
                    detail="a dependency ended dead or cancelled (on_upstream_failure)",
                )
                todo = [(r[1], Status.CANCELLED.value) for r in cancelled]
        return released

    def _count(self, counted: Counter[tuple[int, int]]) -> list[str]:
        engine = self.engine
        keys = sorted(counted)
        rows, _ = self._run(
            "FANIN_DECREMENT",
            engine.batch(down=[k[0] for k in keys], fanin=[k[1] for k in keys], n=[counted[k] for k in keys]),
            prepare=True,
        )
        emptied = Counter(r[0] for r in rows if r[1] == 0)
        if not emptied:
            return []
        downs = sorted(emptied)
        rows, _ = self._run(
            "STEP_DECREMENT", engine.batch(down=downs, n=[emptied[d] for d in downs]), prepare=True
        )
        ready = sorted(r[0] for r in rows if r[1] == 0)
        if not ready:
            return []
        moved = self._move("STEP_RELEASE", {"ids": engine.column(ready)}, detail="")
        keyed = {(r[8], r[9]) for r in moved if r[9]}
        if keyed:
            self.promote_keys(keyed)
        return [r[1] for r in moved]

    def settle_moved(self, rows: Sequence[Sequence[Any]]) -> None:
        """After a sweep's or an operator's move (its moved rows, :data:`MOVED_NAMES` columns), in
        its transaction: settle the dependents of those that are workflow steps."""
        self.settle_ids([(r[1], r[2]) for r in rows])

    def settle_ids(self, ended: Sequence[tuple[str, str]]) -> None:
        """:meth:`settle` for messages not known to be steps (``(message id, new status)``): one
        read finds those that are."""
        ended = [(m, s) for m, s in ended if s in _ENDED]
        if not ended:
            return
        steps, _ = self._run("STEPS_AMONG", {"ids": self.engine.column(m for m, _ in ended)}, prepare=True)
        if steps:
            self.settle([(r[0], r[1]) for r in steps])

    # -- a running step's fan-out ------------------------------------------------------------

    def add_steps(
        self, parent: str, workflow_id: str, steps: Sequence[StepSpec], *, actor: str | None = None
    ) -> dict[str, str]:
        """Steps a running step (``parent``, its message id) added to its workflow, in the
        transaction of its outcome, before that outcome settles its edges: each of its dependents
        then waits for every added step too. An added step may wait for other added steps and for
        steps stored before (by name); one of those already ended counts at once."""
        if not steps:
            return {}
        existing = {r[2]: r for r in self._run("WORKFLOW_STEPS", {"wf": workflow_id})[0]}
        clash = sorted({s.name for s in steps} & set(existing))
        if clash:
            raise InvalidWorkflow(
                f"Workflow {workflow_id!r} has a step named {clash[0]!r} already: name each once."
            )
        known = {name: r[1] for name, r in existing.items()}
        check_graph(workflow_id, [StepSpec(n, "", None) for n in known] + list(steps))
        engine = self.engine
        with transaction.atomic(using=self.using, savepoint=False):
            stored = self._insert(workflow_id, steps, known, actor or self.instance_id)
            leaves = sorted(set(stored) - {a for s in steps for a in s.after})
            mids = [stored[n] for n in leaves]
            count = fanin_groups(len(mids))
            for d in sorted(r[0] for r in self._run("DEPENDENTS_OF", {"mid": parent})[0]):
                # The dependent's row first (locked until commit): two steps adding to it at once
                # take their group numbers one after the other.
                if not mids or not self._run("STEP_WAIT_MORE", {"id": d, "n": count})[0]:
                    continue  # no longer waiting (cancelled meanwhile)
                first = self._run("NEXT_FANIN", {"id": d})[0][0][0]
                groups = [first + fanin_group(i, count) for i in range(len(mids))]
                per = Counter(groups)
                self._run(
                    "DEPENDENCY_INSERT",
                    {**engine.batch(down=[d] * len(mids), up=mids, fanin=groups), "wf": workflow_id},
                )
                self._run(
                    "FANIN_INSERT",
                    engine.batch(down=[d] * len(per), fanin=sorted(per), n=[per[g] for g in sorted(per)]),
                )
            ended = {
                (known[a], existing[a][4])
                for s in steps
                for a in s.after
                if a in known and existing[a][4] in _ENDED
            }
            if ended:
                self.settle(sorted(ended))
        return stored

    # -- the invariants -------------------------------------------------------------------------

    def stranded(self, limit: int = 1000) -> list[tuple[int, str]]:
        """Waiting steps none of whose dependencies is left to settle (``(pk, message id)``): each
        should have been released by its last dependency's outcome. Expected: none."""
        return [(r[0], r[1]) for r in self._run("STRANDED_STEPS", {"limit": limit})[0]]

    def invariants(self, queue: str | None = None, limit: int = 1000) -> Invariants:
        """What ``zeroloss_verify`` checks of workflows (of ``queue``'s steps, or every queue's):
        the stranded steps (see :meth:`stranded`) and the steps released early (pending,
        processing, completed or dead while a dependency is unsettled), each counted and listed
        (at most ``limit``). Expected: none of either."""
        params = {"queue": queue, "limit": limit}
        return Invariants(
            stranded=self._run("STRANDED_COUNT", params)[0][0][0],
            stranded_ids=[r[0] for r in self._run("STRANDED_OF", params)[0]],
            released_early=self._run("RELEASED_EARLY_COUNT", params)[0][0][0],
            released_early_rows=[(r[0], r[1], r[2]) for r in self._run("RELEASED_EARLY", params)[0]],
        )

    def release_stranded(self, pks: Sequence[int], *, actor: str | None = None) -> list[str]:
        """The sweep's safety net: release these waiting steps (found by :meth:`stranded`)."""
        if not pks:
            return []
        with transaction.atomic(using=self.using, savepoint=False):
            moved = self._move(
                "STEP_RELEASE_STRANDED",
                {"ids": self.engine.column(pks)},
                actor=actor,
                detail="released by the sweep: every dependency had settled",
            )
            keyed = {(r[8], r[9]) for r in moved if r[9]}
            if keyed:
                self.promote_keys(keyed)
        return [r[1] for r in moved]

    # -- reading a workflow --------------------------------------------------------------------

    def steps(self, workflow_id: str) -> list[StepRow]:
        """A workflow's steps, in the order they were stored (:class:`StepRow`); [] for none."""
        engine = self.engine
        rows, _ = self._run("WORKFLOW_STEPS", {"wf": workflow_id})
        edges, _ = self._run("WORKFLOW_EDGES", {"wf": workflow_id})
        by_pk = {r[0]: r for r in rows}
        after: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for down, up, settled in edges:
            after[down].append((up, settled))
        return [
            StepRow(
                message_id=r[1],
                name=r[2],
                queue_name=r[3],
                status=r[4],
                attempts=r[5],
                max_attempts=r[6],
                result=engine.to_json(r[7]) if r[7] is not None else None,
                last_error=r[8],
                waiting_on=r[9],
                on_upstream_failure=r[10],
                after=tuple(up for up, _ in after[pk]),
                unsettled=tuple(up for up, settled in after[pk] if not settled),
            )
            for pk, r in by_pk.items()
        ]

    def upstream(self, message_id: str) -> dict[str, Upstream]:
        """What a step's dependencies ended with, by step name (and by message id)."""
        engine = self.engine
        rows, _ = self._run("UPSTREAM_OF", {"mid": message_id})
        seen: dict[str, Upstream] = {}
        for mid, name, status, result, settled in rows:
            u = Upstream(mid, name, status, engine.to_json(result) if result is not None else None, settled)
            seen[name] = u
            seen[mid] = u
        return seen


@dataclass(frozen=True)
class Invariants:
    """:meth:`Workflows.invariants`: counts, and the first steps of each (ids; for a step released
    early, ``(its id, an unsettled dependency's id, its status)``)."""

    stranded: int
    stranded_ids: list[str]
    released_early: int
    released_early_rows: list[tuple[str, str, str]]


@dataclass(frozen=True)
class StepRow:
    """One step of a workflow as :meth:`Workflows.steps` reads it."""

    message_id: str
    name: str
    queue_name: str
    status: str
    attempts: int
    max_attempts: int
    result: Any
    last_error: str
    waiting_on: int
    on_upstream_failure: str
    #: The message ids it waits for, and those of them not yet settled.
    after: tuple[str, ...]
    unsettled: tuple[str, ...]


@dataclass(frozen=True)
class Upstream:
    """One dependency as its dependent sees it (``delivery.upstream[name]``)."""

    message_id: str
    name: str
    #: Its status now (``completed``; ``dead`` or ``cancelled`` under ``on_upstream_failure="run"``).
    status: str
    #: What its handler returned (JSON), or None.
    result: Any
    #: Its status when its outcome was counted for this step.
    settled: str
