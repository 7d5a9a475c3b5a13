"""The values the ledger hands out: leases, sweep reports, batch outcomes, integrity reports."""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..core.durations import format_duration

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
    #: The headers the message was sent with, as the claim read them (``{}``: none); None
    #: when the lease was built without them (they are then read when asked for).
    headers: dict[str, Any] | None = None
    #: When the message became claimable (database time: sent, or its delay or backoff over),
    #: as the claim read it; None when the lease was built otherwise. The pickup latency's start.
    available_at: dt.datetime | None = None
    #: When the message was stored (database time), as the claim read it; None when the lease
    #: was built otherwise. Bounds the lease holder's statements to its partition.
    created_at: dt.datetime | None = None
    #: Its workflow's id when it is a workflow's step (docs/workflows.md): its outcome then
    #: settles its dependents in the same transaction.
    workflow_id: str = ""

    def __bool__(self) -> bool:
        return True


class Verdict(StrEnum):
    """What the lease holder reports about one message (see :meth:`complete`)."""

    ACKNOWLEDGE = "acknowledge"  # the handler succeeded: completed
    FAIL = "fail"  # the handler raised: retry after a backoff, or dead when attempts are spent
    RELEASE = "release"  # never started: back to pending, the attempt not counted
    SNOOZE = "snooze"  # zeroloss.Snooze: pending again after ``delay``, the attempt not counted
    FAIL_FINAL = "fail_final"  # zeroloss.Fail, or an error the handler's policy does not retry: dead now


@dataclass(frozen=True, slots=True)
class Completion:
    """One outcome for :meth:`ZeroLossMessageService.record_outcomes`."""

    lease: Lease
    verdict: Verdict
    #: The failure's text (``FAIL``) or why it is released (``RELEASE``).
    error: str = ""
    #: JSON-serialisable value the handler returned (``ACKNOWLEDGE``); stored on the message.
    result: Any = None
    #: Seconds before it may run again: ``FAIL`` (None: ``RETRY_BACKOFF``) and ``SNOOZE``.
    delay: float | None = None
    #: Steps its handler added to its workflow (``delivery.workflow.step``), stored with its
    #: acknowledgement (``zeroloss.ledger.workflows.StepSpec``); dropped with any other outcome.
    steps: tuple[Any, ...] = ()


@dataclass(frozen=True)
class CompletionReport:
    """What one :meth:`complete` call recorded. ``refused``: the lease was no longer held."""

    acknowledged: list[str] = field(default_factory=list)
    retrying: list[str] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    #: An operator aborted them while they ran: whatever the handler did, recorded ``cancelled``.
    cancelled: list[str] = field(default_factory=list)
    #: Their handlers raised ``zeroloss.Snooze``: pending again later, the attempt not counted.
    snoozed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RecoveryReport:
    """What one sweep did: ids moved back to pending, ids dead-lettered, ids published again."""

    requeued: list[str] = field(default_factory=list)
    dead_lettered: list[str] = field(default_factory=list)
    redispatched: list[str] = field(default_factory=list)
    batches: int = 0
    #: Ordering keys whose next message was released because their head finished unseen.
    keys_repaired: int = 0
    #: Expired leases of aborted messages: recorded ``cancelled``, never run again.
    cancelled: list[str] = field(default_factory=list)
    #: Workflow steps left ``waiting`` although every dependency had settled, released by the
    #: sweep's safety net (docs/workflows.md). Expected to stay empty.
    released_stranded: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.requeued) + len(self.dead_lettered)


class CancelOutcome(StrEnum):
    """What :meth:`cancel_messages` did with one message (or why it did nothing)."""

    CANCELLED = "cancelled"  # it was pending (claimable, delayed or behind its key): cancelled
    ABORT_REQUESTED = "abort_requested"  # processing, ``abort=True``: its handler is asked to stop
    RUNNING = "running"  # processing, no ``abort``: left alone
    ABORT_ALREADY_REQUESTED = "abort_already_requested"  # processing, asked to stop before
    FINISHED = "finished"  # completed or dead: nothing to cancel
    ALREADY_CANCELLED = "already_cancelled"


@dataclass(frozen=True)
class CancelResult:
    """One message of a cancel: what happened, and the status it has now."""

    message_id: str
    outcome: CancelOutcome
    status: str

    @property
    def ok(self) -> bool:
        """It was cancelled, or its abort was requested by this call."""
        return self.outcome in (CancelOutcome.CANCELLED, CancelOutcome.ABORT_REQUESTED)

    def as_dict(self) -> dict[str, Any]:
        return {"message_id": self.message_id, "outcome": self.outcome.value, "status": self.status}


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
    replication: Any = None  # zeroloss.integrations.replication.ReplicationStatus

    @property
    def issues(self) -> list[str]:
        """The findings as human-readable lines."""
        return [f.detail for f in self.findings]


class KeyWhy(StrEnum):
    """Why an ordering key's head holds up the messages behind it (see :meth:`blocked_keys`)."""

    PROCESSING = "processing"  # under a live lease
    LEASE_EXPIRED = "lease_expired"  # its worker is gone; the sweep will requeue it
    RETRY_BACKOFF = "retry_backoff"  # it failed and waits for its retry
    NO_HEAD = "no_head"  # nothing claimable: promotion missed, the sweep releases the next one
    CLAIMABLE = "claimable"  # not blocked: waiting for a worker


@dataclass(frozen=True)
class KeyHead:
    """The head of one ordering key and what waits behind it, on the database clock ``now``."""

    queue_name: str
    ordering_key: str
    #: ``None`` when the key has messages waiting but no head (``why`` is ``no_head``).
    message_id: str | None
    status: str | None
    why: KeyWhy
    #: When the head entered its state: its claim (processing) or its failure (backoff); for a
    #: key without a head, when its oldest waiting message was last moved.
    since: dt.datetime | None
    #: Messages behind the head (pending, not claimable until it finishes).
    behind: int
    now: dt.datetime
    attempts: int = 0
    max_attempts: int = 0
    claimed_by: str = ""
    last_error: str = ""
    #: When the lease runs out (processing) or the retry is due (backoff).
    until: dt.datetime | None = None

    @property
    def blocked(self) -> bool:
        return self.behind > 0 and self.why != KeyWhy.CLAIMABLE

    @property
    def blocked_for(self) -> float | None:
        """Seconds since :attr:`since`."""
        return None if self.since is None else max((self.now - self.since).total_seconds(), 0.0)

    @property
    def detail(self) -> str:
        """Why, in words (one line; the last error shortened)."""
        left = None if self.until is None else (self.until - self.now).total_seconds()
        attempt = f"attempt {self.attempts}/{self.max_attempts}"
        if self.why == KeyWhy.PROCESSING:
            return f"processing by {self.claimed_by} ({attempt}), lease ends in {format_duration(left)}"
        if self.why == KeyWhy.LEASE_EXPIRED:
            overdue = format_duration(None if left is None else -left)
            return f"lease of {self.claimed_by} expired {overdue} ago ({attempt}); the sweep will requeue it"
        if self.why == KeyWhy.RETRY_BACKOFF:
            error = self.last_error if len(self.last_error) <= 200 else self.last_error[:200] + "…"
            return f"{attempt} failed, retry in {format_duration(left)}: {error}"
        if self.why == KeyWhy.NO_HEAD:
            return "no head: the sweep releases the next message within SWEEP_INTERVAL"
        return "claimable: waiting for a worker"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``zeroloss_status --json``'s ``blocked_keys`` entries)."""
        return {
            "queue": self.queue_name,
            "key": self.ordering_key,
            "head_message_id": self.message_id,
            "head_status": self.status,
            "why": self.why.value,
            "detail": self.detail,
            "since": None if self.since is None else self.since.isoformat(),
            "blocked_for": self.blocked_for,
            "behind": self.behind,
            "attempts": self.attempts,
            "max_attempts": self.max_attempts,
            "claimed_by": self.claimed_by,
            "last_error": self.last_error,
            "until": None if self.until is None else self.until.isoformat(),
            "now": self.now.isoformat(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KeyHead:
        def at(value: str | None) -> dt.datetime | None:
            return None if value is None else dt.datetime.fromisoformat(value)

        now = at(data["now"])
        assert now is not None
        return cls(
            queue_name=data["queue"],
            ordering_key=data["key"],
            message_id=data["head_message_id"],
            status=data["head_status"],
            why=KeyWhy(data["why"]),
            since=at(data["since"]),
            behind=int(data["behind"]),
            now=now,
            attempts=int(data["attempts"]),
            max_attempts=int(data["max_attempts"]),
            claimed_by=data["claimed_by"],
            last_error=data["last_error"],
            until=at(data["until"]),
        )
