"""Workflows (docs/workflows.md): steps stored whole in the sender's transaction, each released by
its dependencies' fenced outcomes.

::

    with transaction.atomic():
        flow = zeroloss.Workflow(f"order-{order.pk}")
        charge = flow.step("payments", {"order": order.pk}, name="charge")
        picks = [flow.step("warehouse", {"item": i}) for i in items]
        flow.step("shipping", {"order": order.pk}, after=[charge, *picks])
        flow.send()
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.states import LIVE_STATUSES, Status
from ..exceptions import InvalidWorkflow
from ..ledger.service import ZeroLossMessageService
from ..ledger.types import CancelResult
from ..ledger.workflow_graph import POLICIES, StepSpec, StoredWorkflow, step_message_id
from .handlers import default_max_attempts
from .transports import _check_queue, _check_transaction, database_for

__all__ = ["Step", "Workflow", "WorkflowView", "cancel_workflow", "chain", "chord", "group"]


@dataclass(frozen=True)
class Step:
    """A step of a workflow, as :meth:`Workflow.step` returns it: pass it in another step's
    ``after=``. ``message_id`` is the step's message's id (``<workflow id>/<name>``)."""

    workflow_id: str
    name: str

    @property
    def message_id(self) -> str:
        return step_message_id(self.workflow_id, self.name)


def _names(workflow_id: str, after: Iterable[Step | str]) -> tuple[str, ...]:
    names = []
    for a in after:
        if isinstance(a, Step):
            if a.workflow_id != workflow_id:
                raise InvalidWorkflow(
                    f"A step of workflow {workflow_id!r} cannot wait for step {a.name!r} of workflow "
                    f"{a.workflow_id!r}: dependencies stay inside one workflow. Nothing was stored."
                )
            names.append(a.name)
        elif isinstance(a, str):
            names.append(a)
        else:
            raise InvalidWorkflow(f"after= takes steps (flow.step(...)) or step names, got {a!r}.")
    return tuple(dict.fromkeys(names))


class _Builder:
    def __init__(self, workflow_id: str) -> None:
        if not isinstance(workflow_id, str) or not workflow_id:
            raise InvalidWorkflow(f"A workflow's id must be a non-empty string, got {workflow_id!r}.")
        self.workflow_id = workflow_id
        self._steps: list[StepSpec] = []
        self._using: str | None = None

    def step(
        self,
        queue_name: str,
        data: Any,
        *,
        name: str | None = None,
        after: Iterable[Step | str] = (),
        max_attempts: int | None = None,
        priority: int = 0,
        ordering_key: str = "",
        headers: dict[str, Any] | None = None,
        on_upstream_failure: str = "wait",
    ) -> Step:
        """Add a step: a message of ``queue_name`` that is not claimable until every step in
        ``after`` has completed. ``on_upstream_failure``: ``"wait"`` (a dead dependency keeps it
        waiting until a redrive completes it), ``"cancel"`` (it is cancelled, and so on down) or
        ``"run"`` (it runs, and sees the failure in ``delivery.upstream``)."""
        _check_queue(queue_name)
        alias = database_for(queue_name)
        if self._using is None:
            self._using = alias
        elif alias != self._using:
            raise InvalidWorkflow(
                f"Step on queue {queue_name!r} lives in database {alias!r}, but this workflow's other steps "
                f"in {self._using!r} (ZEROLOSS['QUEUE_DATABASES']): a step is released in the transaction "
                "of its dependencies' outcomes, so every step of a workflow must share one database."
            )
        if on_upstream_failure not in POLICIES:
            raise InvalidWorkflow(
                f"on_upstream_failure must be one of {', '.join(POLICIES)}, got {on_upstream_failure!r}."
            )
        name = name if name is not None else f"{queue_name}-{len(self._steps) + self._offset()}"
        spec = StepSpec(
            name=name,
            queue_name=queue_name,
            data=data,
            after=_names(self.workflow_id, after),
            max_attempts=default_max_attempts(queue_name) if max_attempts is None else max_attempts,
            priority=priority,
            ordering_key=ordering_key,
            headers=headers,
            on_upstream_failure=on_upstream_failure,
        )
        self._steps.append(spec)
        return Step(self.workflow_id, name)

    def _offset(self) -> int:
        return 0

    @property
    def steps(self) -> tuple[StepSpec, ...]:
        return tuple(self._steps)


class Workflow(_Builder):
    """A set of steps stored together in the caller's transaction (:meth:`send`); the id makes
    sending it idempotent: the same id with the same steps returns the stored workflow, with
    other steps raises :class:`~zeroloss.exceptions.WorkflowConflict`."""

    @property
    def id(self) -> str:
        return self.workflow_id

    def send(self) -> StoredWorkflow:
        """Store every step (all, or none if anything is invalid) in the caller's transaction."""
        if not self._steps:
            raise InvalidWorkflow(f"Workflow {self.workflow_id!r} has no step: add one with flow.step(...).")
        alias = self._using or "default"
        _check_transaction(alias)
        return ZeroLossMessageService(using=alias).workflows.store(self.workflow_id, self._steps)


class WorkflowView(_Builder):
    """A running step's workflow (``delivery.workflow``): :meth:`step` adds a step to it, stored
    with the running step's acknowledgement; the running step's dependents wait for it too."""

    def __init__(self, workflow_id: str, existing: int = 0) -> None:
        super().__init__(workflow_id)
        self._existing = existing

    def _offset(self) -> int:
        return self._existing

    @property
    def id(self) -> str:
        return self.workflow_id


def chain(*steps: tuple[str, Any], workflow_id: str) -> Workflow:
    """Steps run one after another: ``chain(("a", {...}), ("b", {...}), workflow_id="...")``; each
    ``(queue, data)`` waits for the one before it. Returns the workflow, to :meth:`Workflow.send`."""
    flow = Workflow(workflow_id)
    previous: list[Step] = []
    for queue, data in steps:
        previous = [flow.step(queue, data, after=previous)]
    return flow


def group(*steps: tuple[str, Any], workflow_id: str) -> Workflow:
    """Steps run side by side (no dependency between them)."""
    flow = Workflow(workflow_id)
    for queue, data in steps:
        flow.step(queue, data)
    return flow


def chord(members: Sequence[tuple[str, Any]], callback: tuple[str, Any], *, workflow_id: str) -> Workflow:
    """A group followed by one step that waits for every member (Celery's chord)."""
    flow = Workflow(workflow_id)
    picks = [flow.step(queue, data) for queue, data in members]
    flow.step(callback[0], callback[1], after=picks, name="callback")
    return flow


def cancel_workflow(
    workflow_id: str, *, using: str = "default", actor: str | None = None, reason: str = ""
) -> list[CancelResult]:
    """Cancel every step of a workflow not yet finished: waiting and pending ones at once, running
    ones aborted (as :func:`zeroloss.cancel` with ``abort=True``). One result per such step."""
    service = ZeroLossMessageService(using=using)
    steps = service.workflows.steps(workflow_id)
    # Waiting steps first: cancelled by the operator, not as the dependents of a cancelled step.
    live = [s.message_id for s in steps if s.status == Status.WAITING] + [
        s.message_id for s in steps if s.status in LIVE_STATUSES and s.status != Status.WAITING
    ]
    return (
        service.cancel_messages(
            live, abort=True, actor=actor, detail=reason or f"workflow {workflow_id} cancelled"
        )
        if live
        else []
    )
