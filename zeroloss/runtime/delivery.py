"""What a handler receives: :class:`Delivery` (also importable from ``zeroloss.runtime.processing``)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..core.settings import get_settings
from ..core.states import Status
from ..ledger.events import Event, Finished, Released
from ..ledger.types import Lease

if TYPE_CHECKING:
    from .worker.keeper import LeaseKeeper


@dataclass
class Delivery:
    """What a handler receives: the message, its attempt, and whether its lease is still held."""

    lease: Lease
    keeper: LeaseKeeper | None = None
    #: In a process-pool child (no keeper there): the flag the parent sets when its keeper
    #: sees this message's abort request.
    abort_flag: Callable[[], bool] | None = None

    @property
    def message_id(self) -> str:
        return self.lease.message_id

    @property
    def queue_name(self) -> str:
        return self.lease.queue_name

    @property
    def payload(self) -> Any:
        return self.lease.payload

    @functools.cached_property
    def headers(self) -> dict[str, Any]:
        """The headers the message was sent with (``send(..., headers=...)``); ``{}`` if none.

        A claim reads them with the message; a lease built otherwise reads them from the
        ledger the first time they are asked for (one query)."""
        if self.lease.headers is not None:
            return dict(self.lease.headers)
        # Deferred: the handler path imports before django.setup() (a pool child).
        from ..ledger.models import Message

        if self.keeper is not None:
            using = self.keeper.service.using
        else:  # where send() stored it (transports.database_for, without its import)
            using = get_settings().QUEUE_DATABASES.get(self.queue_name, "default")
        stored = Message.objects.using(using).filter(message_id=self.message_id).values_list("headers")
        found = stored.first()
        return dict(found[0]) if found is not None and found[0] else {}

    @property
    def attempt(self) -> int:
        return self.lease.attempt

    def _using(self) -> str:
        if self.keeper is not None:
            return self.keeper.service.using
        return get_settings().QUEUE_DATABASES.get(self.queue_name, "default")

    @functools.cached_property
    def upstream(self) -> dict[str, Any]:
        """A workflow's step: what each of its dependencies ended with, by step name and by
        message id (``.result``: what its handler returned; ``.status``; docs/workflows.md).
        ``{}`` for a message that is not a step or waits for nothing. Read once, when asked."""
        if not self.lease.workflow_id:
            return {}
        # Deferred: the handler path imports before django.setup() (a pool child).
        from ..ledger.service import ZeroLossMessageService

        return ZeroLossMessageService(using=self._using()).workflows.upstream(self.message_id)

    @functools.cached_property
    def workflow(self) -> Any:
        """A workflow's step: its workflow (``.id``), to which :meth:`step` adds steps, stored with
        this step's acknowledgement (in its transaction when transactional); this step's
        dependents then wait for them too. None for a message that is not a step."""
        if not self.lease.workflow_id:
            return None
        # Deferred: runtime.workflows imports the transports (Django's app registry).
        from .workflows import WorkflowView

        return WorkflowView(self.lease.workflow_id)

    def added_steps(self) -> tuple[Any, ...]:
        """The steps the handler added to its workflow (none if it never asked for it)."""
        view = self.__dict__.get("workflow")
        return view.steps if view is not None else ()

    @property
    def lease_lost(self) -> bool:
        """True once the lease is known lost: a renewal was refused, or none succeeded before it
        expired (the database was unreachable). A long handler may stop early: its outcome
        will be refused and the message runs again."""
        return self.keeper is not None and self.keeper.is_lost(self.lease.message_id)

    @property
    def abort_requested(self) -> bool:
        """True once an operator aborted this message (``zeroloss_cancel --abort``), within
        ``ABORT_POLL_INTERVAL`` of the abort's commit. Its outcome is ``cancelled`` whatever
        the handler does now; it should stop, and may raise :class:`Aborted` to do so."""
        if self.abort_flag is not None:
            return self.abort_flag()
        return self.keeper is not None and self.keeper.is_abort_requested(self.lease.message_id)

    def raise_if_abort_requested(self) -> None:
        """Raise :class:`Aborted` if :attr:`abort_requested` (a transactional handler's
        effects then roll back)."""
        if self.abort_requested:
            raise Aborted(self.lease.message_id)


class Aborted(Exception):
    """A handler may raise it to stop once its message was aborted; the outcome is ``cancelled``."""


class LeaseLost(Exception):
    """Raised inside a transactional handler's transaction to roll it back when the ack is refused."""


#: What waits for a message's outcome to be stored, in this process: message id -> callback.
_when_stored: dict[str, Callable[[str], None]] = {}
_when_stored_lock = threading.Lock()


def call_when_stored(message_id: str, callback: Callable[[str], None]) -> None:
    """Call ``callback(outcome)`` once this run's outcome of ``message_id`` is stored and
    committed: ``"completed"``, ``"retrying"`` (snoozed too), ``"dead"`` or ``"cancelled"`` (not at
    all when it was refused: the lease was lost, another run owns the message). The task backend's ``task_finished``."""
    with _when_stored_lock:
        _when_stored[message_id] = callback


#: What a waiter is told, by the outcome of :class:`~.ledger.events.Finished`.
_STORED_AS = {
    Status.COMPLETED.value: Status.COMPLETED.value,
    "failed": "retrying",
    "snoozed": "retrying",
    Status.DEAD.value: Status.DEAD.value,
    Status.CANCELLED.value: Status.CANCELLED.value,
}


class OutcomeWaiters:
    """The callbacks of :func:`call_when_stored`, as a subscriber of the ledger's events: each
    called once its message's outcome is committed, dropped when the lease was lost or the
    message released."""

    def wants(self, kind: type) -> bool:
        return kind in (Finished, Released) and bool(_when_stored)

    def __call__(self, sender: type | None, events: Sequence[Event]) -> None:
        due: list[tuple[Callable[[str], None], str]] = []
        with _when_stored_lock:
            for e in events:
                if not isinstance(e, Finished | Released):
                    continue
                callback = _when_stored.pop(e.message_id, None)
                told = _STORED_AS.get(e.outcome) if isinstance(e, Finished) else None
                if callback is not None and told is not None:
                    due.append((callback, told))
        for callback, told in due:
            callback(told)


# Recorded (``last_error``) and documented by their public path, not this module's.
for _kind in (Aborted, LeaseLost):
    _kind.__module__ = "zeroloss.delivery"
