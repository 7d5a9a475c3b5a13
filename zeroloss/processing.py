"""Running one claimed message: heartbeat, handler, acknowledgement or failure.

Shared by the Celery delivery task and the built-in database worker, so both follow the
same path and the same guarantees.
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from django.db import close_old_connections, connections, transaction

from .exceptions import UnknownQueue
from .handlers import get_handler
from .service import Lease, ZeroLossMessageService

logger = logging.getLogger("zeroloss")


class Outcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"  # back to pending after a backoff, or dead: see the ledger
    LEASE_LOST = "lease_lost"  # the lease expired or was revoked: another run owns it now
    ABSORBED = "absorbed"  # a duplicate delivery: nothing claimable, handler not run
    RELEASED = "released"  # given back unstarted at shutdown


@dataclass
class Delivery:
    """What a handler receives: the message, its attempt, and whether its lease is still held."""

    lease: Lease
    keeper: LeaseKeeper | None = None

    @property
    def message_id(self) -> str:
        return self.lease.message_id

    @property
    def queue_name(self) -> str:
        return self.lease.queue_name

    @property
    def payload(self) -> Any:
        return self.lease.payload

    @property
    def attempt(self) -> int:
        return self.lease.attempt

    @property
    def lease_lost(self) -> bool:
        """True once a renewal failed: a long handler may stop early, its ack will be refused."""
        return self.keeper is not None and self.lease.message_id in self.keeper.lost


class LeaseLost(Exception):
    """Raised inside a transactional handler's transaction to roll it back when the ack is refused."""


@dataclass
class LeaseKeeper:
    """A background thread that renews every held lease every ``interval`` seconds."""

    service: ZeroLossMessageService
    interval: float
    held: dict[str, Lease] = field(default_factory=dict)
    lost: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zeroloss-heartbeat", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def hold(self, leases: Iterable[Lease]) -> None:
        with self._lock:
            for lease in leases:
                self.held[lease.message_id] = lease

    def drop(self, message_id: str) -> None:
        with self._lock:
            self.held.pop(message_id, None)
            self.lost.discard(message_id)

    def renew_now(self) -> None:
        with self._lock:
            leases = list(self.held.values())
        if not leases:
            return
        renewed = self.service.renew_leases(leases)
        with self._lock:
            for lease in leases:
                if lease.message_id not in renewed and lease.message_id in self.held:
                    if lease.message_id not in self.lost:
                        logger.warning("lease of %s was lost before it could be renewed", lease.message_id)
                    self.lost.add(lease.message_id)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    self.renew_now()
                except Exception:  # a failed renewal is retried next tick; the lease bounds the damage
                    logger.exception("lease renewal failed")
        finally:
            connections.close_all()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)


def process(service: ZeroLossMessageService, lease: Lease, keeper: LeaseKeeper | None = None) -> Outcome:
    """Run the handler of a claimed message and settle it in the ledger."""
    own_keeper = keeper is None
    if keeper is None:
        keeper = LeaseKeeper(service, service.settings.heartbeat_interval).start()
    keeper.hold([lease])
    try:
        return _run(service, lease, keeper)
    finally:
        keeper.drop(lease.message_id)
        if own_keeper:
            keeper.stop()


def _run(service: ZeroLossMessageService, lease: Lease, keeper: LeaseKeeper) -> Outcome:
    try:
        spec = get_handler(lease.queue_name)
    except UnknownQueue as exc:
        service.mark_failed(lease.message_id, lease.token, str(exc))
        return Outcome.FAILED
    delivery = Delivery(lease, keeper)
    try:
        if spec.transactional:
            with transaction.atomic(using=service.using):
                spec.func(delivery)
                if not service.acknowledge_message(lease.message_id, lease.token):
                    raise LeaseLost(lease.message_id)
            return Outcome.COMPLETED
        spec.func(delivery)
    except LeaseLost:
        logger.warning("%s: lease lost; the handler's transaction was rolled back", lease.message_id)
        return Outcome.LEASE_LOST
    except Exception as exc:
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        tail = "".join(traceback.format_tb(exc.__traceback__)[-3:])
        if service.mark_failed(lease.message_id, lease.token, f"{error}\n{tail}"):
            logger.info("%s: handler failed (attempt %d): %s", lease.message_id, lease.attempt, error)
            return Outcome.FAILED
        return Outcome.LEASE_LOST
    if service.acknowledge_message(lease.message_id, lease.token):
        return Outcome.COMPLETED
    logger.warning("%s: handled, but the lease was lost before the acknowledgement", lease.message_id)
    return Outcome.LEASE_LOST


def deliver(service: ZeroLossMessageService, message_id: str) -> Outcome:
    """Claim one message by id and process it; a duplicate delivery is absorbed by the claim."""
    close_old_connections()
    lease = service.mark_processing(message_id)
    if lease is None:
        return Outcome.ABSORBED
    return process(service, lease)
