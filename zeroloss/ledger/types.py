"""The values the ledger hands out: leases, sweep reports, batch outcomes, integrity reports."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: Severities of integrity findings: a monitor pages on ``critical``.
CRITICAL = "critical"
WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Lease:
    """A claim on one message. Pass ``token`` back to renew, acknowledge or fail it."""

    message_id: str
    token: uuid.UUID
    expires_at: dt.datetime
    attempt: int
    queue_name: str
    payload: Any
    max_attempts: int
    ordering_key: str = ""
    priority: int = 0

    def __bool__(self) -> bool:
        return True


class Verdict(StrEnum):
    """What the lease holder reports about one message (see :meth:`complete`)."""

    ACKNOWLEDGE = "acknowledge"  # the handler succeeded: completed
    FAIL = "fail"  # the handler raised: retry after a backoff, or dead when attempts are spent
    RELEASE = "release"  # never started: back to pending, the attempt not counted


@dataclass(frozen=True, slots=True)
class Completion:
    """One outcome for :meth:`ZeroLossMessageService.complete`."""

    lease: Lease
    verdict: Verdict
    #: The failure's text (``FAIL``) or why it is released (``RELEASE``).
    error: str = ""
    #: JSON-serialisable value the handler returned (``ACKNOWLEDGE``); stored on the message.
    result: Any = None


@dataclass(frozen=True)
class CompletionReport:
    """What one :meth:`complete` call recorded. ``refused``: the lease was no longer held."""

    acknowledged: list[str] = field(default_factory=list)
    retrying: list[str] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RecoveryReport:
    """What one sweep did: ids moved back to pending, ids dead-lettered, ids published again."""

    requeued: list[str] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)
    redispatched: list[str] = field(default_factory=list)
    batches: int = 0
    #: Ordering keys whose next message was released because their head finished unseen.
    keys_repaired: int = 0

    @property
    def total(self) -> int:
        return len(self.requeued) + len(self.dead_lettered)


@dataclass(frozen=True)
class IntegrityFinding:
    """One problem with one message. ``code`` is stable; ``detail`` is for people and may change."""

    code: str
    severity: str
    detail: str


@dataclass(frozen=True)
class IntegrityReport:
    message_id: str
    valid: bool
    findings: list[IntegrityFinding]
    status: str | None = None
    replication: Any = None  # zeroloss.replication.ReplicationStatus

    @property
    def issues(self) -> list[str]:
        """The findings as human-readable lines."""
        return [f.detail for f in self.findings]
