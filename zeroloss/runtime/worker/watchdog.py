"""The lease keeper's watchdog of the transactional batches (:mod:`.transactional`): a batch
whose handler runs past its hard bound (its ``time_limit``, else ``HANDLER_TIMEOUT``) has its
server session ended, so that its transaction and every lock it holds go with it; its other
messages, whose effects rolled back, are given back unstarted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...ledger.types import Completion, Lease, Verdict
from .batch import Batch

if TYPE_CHECKING:
    from ...ledger.service import ZeroLossMessageService

logger = logging.getLogger("zeroloss")


@dataclass
class TransactionWatch:
    """A transactional batch's transaction, watched by the keeper (see :meth:`LeaseKeeper.watch`)."""

    batch: Batch
    #: The server session running the transaction.
    session: int
    #: Messages whose handlers ran in the transaction, their outcomes not committed yet.
    done: list[Lease] = field(default_factory=list)
    #: Set once the keeper ended the session: the transaction rolled back, nothing of it landed.
    ended: bool = False
    #: The message whose handler ran past ``HANDLER_TIMEOUT`` when the session was ended.
    overdue: Lease | None = None


class TransactionWatchdog:
    """The watchdog part of :class:`.keeper.LeaseKeeper` (its state is the keeper's)."""

    service: ZeroLossMessageService
    handler_timeout: float | None
    _held: dict[str, Any]
    _watched: dict[int, TransactionWatch]
    _lock: threading.Lock

    if TYPE_CHECKING:  # the keeper's own

        def give_back(self, completions: Iterable[Completion]) -> None: ...

        def _lose(self, message_id: str) -> None: ...

    def watch(self, batch: Batch, session: int | None) -> TransactionWatch | None:
        """Watch a transactional batch's transaction, run by server session ``session``
        (None: the database runs in this process, nothing to end). Unwatch when it ends."""
        if session is None:
            return None
        watch = TransactionWatch(batch, session)
        with self._lock:
            self._watched[id(watch)] = watch
        return watch

    def unwatch(self, watch: TransactionWatch | None) -> None:
        if watch is not None:
            with self._lock:
                self._watched.pop(id(watch), None)

    def _overdue_transactions(self) -> list[TransactionWatch]:
        now = time.monotonic()
        with self._lock:
            overdue = []
            for w in self._watched.values():
                running = w.batch.running
                held = self._held.get(running.message_id) if running is not None else None
                limit = held.limit if held is not None else self.handler_timeout
                if (
                    not w.ended
                    and running is not None
                    and limit is not None
                    and now - w.batch.running_since >= limit
                ):
                    overdue.append(w)
            return overdue

    def end_overdue_transactions(self) -> int:
        """End the transactions of batches whose handler runs past ``HANDLER_TIMEOUT``.

        The session is ended and waited for, so nothing of its transaction can commit after:
        the messages it had run are given back unstarted (their effects rolled back with it),
        and the one still running is left to its lease (the sweep counts its attempt)."""
        ended = 0
        for watch in self._overdue_transactions():
            running = watch.batch.running
            if not self.service.engine.end_session(self.service.connection, watch.session):
                continue  # still going: tried again at the next tick
            watch.overdue = running
            watch.ended = True
            ended += 1
            logger.warning(
                "%s: its transactional handler ran past its hard time limit (time_limit, else "
                "HANDLER_TIMEOUT): its batch's transaction was ended (session %d); %d message(s) it had "
                "run go back unstarted",
                running.message_id if running else "?",
                watch.session,
                len(watch.done),
            )
            self.give_back(
                Completion(
                    lease,
                    Verdict.RELEASE,
                    "released unstarted: its batch's transaction was ended at HANDLER_TIMEOUT",
                )
                for lease in watch.done
            )
            if running is not None:
                with self._lock:
                    self._lose(running.message_id)
            for lease in watch.batch.take_unstarted():
                self.give_back([Completion(lease, Verdict.RELEASE, "released unstarted at HANDLER_TIMEOUT")])
                # (still in hand: renewed until the release lands)
        return ended
