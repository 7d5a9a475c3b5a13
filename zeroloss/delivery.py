"""What a handler receives: :class:`Delivery` (also importable from ``zeroloss.processing``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .ledger.types import Lease

if TYPE_CHECKING:
    from .worker.keeper import LeaseKeeper


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
        """True once the lease is known lost: a renewal was refused, or none succeeded before it
        expired (the database was unreachable). A long handler may stop early: its outcome
        will be refused and the message runs again."""
        return self.keeper is not None and self.keeper.is_lost(self.lease.message_id)


class LeaseLost(Exception):
    """Raised inside a transactional handler's transaction to roll it back when the ack is refused."""
