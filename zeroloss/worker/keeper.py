"""The lease keeper: one thread per worker process that renews the leases of messages in hand.

A message is *in hand* from its claim until its outcome is recorded (a batched outcome may
wait a few milliseconds for its flush; the lease is renewed until then). It is not renewed
once the keeper knows it lost the lease, nor past ``HANDLER_TIMEOUT``. Claimed messages not
yet started are never held behind a handler that runs long: after one renewal interval the
keeper gives them back (released, the attempt not counted) so another worker takes them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.db import connections

from ..ledger.types import Completion, Lease, Verdict
from ..outage import Backoff, OutageMonitor
from ..service import ZeroLossMessageService

logger = logging.getLogger("zeroloss")


class Batch:
    """The claimed messages of one worker thread, taken one at a time (thread-safe)."""

    def __init__(self, leases: Iterable[Lease]) -> None:
        self._lock = threading.Lock()
        self._waiting: deque[Lease] = deque(leases)
        self.running: Lease | None = None
        self.running_since = 0.0

    def next(self) -> Lease | None:
        with self._lock:
            self.running = self._waiting.popleft() if self._waiting else None
            self.running_since = time.monotonic()
            return self.running

    def done(self) -> None:
        with self._lock:
            self.running = None

    @property
    def has_more(self) -> bool:
        return bool(self._waiting)

    def take_unstarted(self, *, if_running_longer_than: float | None = None) -> list[Lease]:
        """Remove and return the messages not started yet (all, or only when the one running
        has run longer than the given seconds)."""
        with self._lock:
            if if_running_longer_than is not None and (
                self.running is None or time.monotonic() - self.running_since < if_running_longer_than
            ):
                return []
            taken = list(self._waiting)
            self._waiting.clear()
            return taken


@dataclass
class _Held:
    lease: Lease
    #: Monotonic time by which the lease has certainly expired unless renewed (measured from
    #: before the statement that set it, so never later than the database's own expiry).
    expires: float
    since: float
    batch: Batch | None = None
    paused: bool = False
    timed_out: bool = False


class LeaseKeeper:
    """Renews every held lease each ``interval`` seconds in one statement, on its own connection."""

    def __init__(
        self,
        service: ZeroLossMessageService,
        interval: float,
        *,
        tolerance: float | None = None,
        handler_timeout: float | None = None,
        on_released: Callable[[int], None] | None = None,
    ) -> None:
        self.service = service
        self.interval = interval
        self.tolerance = tolerance
        self.handler_timeout = handler_timeout
        self.on_released = on_released
        self.monitor = OutageMonitor.for_alias(service.using)
        self.lost: set[str] = set()
        self.gave_up: BaseException | None = None
        self._held: dict[str, _Held] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zeroloss-heartbeat", daemon=True)

    # -- what the workers tell it -----------------------------------------------------------

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def hold(
        self, leases: Iterable[Lease], batch: Batch | None = None, *, claimed_at: float | None = None
    ) -> None:
        now = time.monotonic() if claimed_at is None else claimed_at
        ttl = self.service.settings.ACK_TIMEOUT
        with self._lock:
            for lease in leases:
                self._held[lease.message_id] = _Held(lease, now + ttl, now, batch)
                self.lost.discard(lease.message_id)

    def drop(self, message_ids: Iterable[str]) -> None:
        with self._lock:
            for mid in message_ids:
                self._held.pop(mid, None)
                self.lost.discard(mid)

    def forget_later(self, message_ids: Iterable[str]) -> None:
        """Stop renewing these, but remember them as this worker's until their leases have run
        out: their handlers ran, so nothing may release them as never started."""
        with self._lock:
            for mid in message_ids:
                if mid in self._held:
                    self._held[mid].paused = False
                    self.lost.add(mid)

    def _forget_lapsed(self) -> None:
        now = time.monotonic()
        with self._lock:
            for mid in [m for m in self.lost if m in self._held and now >= self._held[m].expires]:
                del self._held[mid]
                self.lost.discard(mid)

    def pause(self, message_ids: Iterable[str]) -> None:
        """Stop renewing rows a transaction of ours has locked (a renewal would wait for it)."""
        with self._lock:
            for mid in message_ids:
                if mid in self._held:
                    self._held[mid].paused = True

    def is_lost(self, message_id: str) -> bool:
        """True once the lease is known lost, or may have expired unrenewed (database down)."""
        with self._lock:
            held = self._held.get(message_id)
            if message_id in self.lost:
                return True
            return held is not None and not held.paused and time.monotonic() >= held.expires

    def held(self) -> list[Lease]:
        with self._lock:
            return [h.lease for h in self._held.values()]

    # -- the thread -----------------------------------------------------------------------

    def _due(self) -> list[_Held]:
        """Held leases to renew now: not paused, not lost, not past ``HANDLER_TIMEOUT``."""
        now = time.monotonic()
        due = []
        with self._lock:
            for h in self._held.values():
                if h.paused or h.lease.message_id in self.lost:
                    continue
                if self.handler_timeout is not None and now - h.since >= self.handler_timeout:
                    if not h.timed_out:
                        h.timed_out = True
                        logger.warning(
                            "%s: its handler has run longer than HANDLER_TIMEOUT (%gs); its lease is left to "
                            "expire and the message goes to another worker",
                            h.lease.message_id,
                            self.handler_timeout,
                        )
                    continue
                due.append(h)
        return due

    def _has_work(self) -> bool:
        self._forget_lapsed()
        if self._due():
            return True
        with self._lock:
            batches = [h.batch for h in self._held.values() if h.batch is not None]
        return any(
            b.running is not None and time.monotonic() - b.running_since >= self.interval for b in batches
        )

    def renew_now(self) -> None:
        due = self._due()
        if not due:
            return
        started = time.monotonic()
        renewed = self.service.renew_leases([h.lease for h in due])
        ttl = self.service.settings.ACK_TIMEOUT
        answered = time.monotonic()
        with self._lock:
            for h in due:
                mid = h.lease.message_id
                if mid not in self._held:
                    continue  # its outcome was recorded meanwhile
                if mid in renewed and answered < h.expires:
                    h.expires = started + ttl
                elif mid in renewed and mid not in self.lost:
                    # Renewed, but only after its lease had run out here: meanwhile the worker
                    # may have reported it lost. Lost stays lost; the lease simply runs out.
                    logger.warning(
                        "lease of %s was renewed only after it had expired here; treated as lost", mid
                    )
                    self.lost.add(mid)
                    h.expires = started + ttl  # remembered as ours until the renewed lease runs out
                elif mid not in self.lost:
                    logger.warning("lease of %s was lost before it could be renewed", mid)
                    self.lost.add(mid)

    def release_stuck_unstarted(self) -> int:
        """Give back claimed messages waiting behind a handler that has run one interval or more."""
        with self._lock:
            batches = {id(h.batch): h.batch for h in self._held.values() if h.batch is not None}
        released = 0
        for batch in batches.values():
            taken = batch.take_unstarted(if_running_longer_than=self.interval)
            if not taken:
                continue
            running = batch.running.message_id if batch.running else "?"
            report = self.service.complete(
                Completion(
                    lease, Verdict.RELEASE, f"released unstarted: waited behind {running}, still running"
                )
                for lease in taken
            )
            self.drop(lease.message_id for lease in taken)
            released += len(report.released)
        if released and self.on_released:
            self.on_released(released)
        return released

    def _run(self) -> None:
        backoff = Backoff()

        def tick() -> None:
            self.renew_now()
            self.release_stuck_unstarted()

        try:
            while not self._stop.wait(self.interval):
                if not self._has_work():
                    # Nothing to renew or release, so no statement: a tick that succeeds without
                    # the database must not tell the outage monitor the database is back (that
                    # logged "reachable again" every tick and restarted DB_OUTAGE_TOLERANCE).
                    continue
                self.monitor.attempt(
                    tick,
                    who="the lease keeper",
                    backoff=backoff,
                    wait=self._stop.wait,
                    tolerance=self.tolerance,
                )
        except BaseException as exc:  # a bug, or the outage outlasted DB_OUTAGE_TOLERANCE
            self.gave_up = exc
            logger.exception("lease keeper stopped: %s", exc)
        finally:
            connections.close_all()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
