"""A test per fencing guard of the statement catalogue, and proof that each one notices its guard gone.

Every statement of :mod:`zeroloss.ledger.statements` that moves a message or acts for a lease
holder re-checks, in its ``WHERE`` clause, what it relies on: the current lease token, the
status it leaves, an unexpired (or, for the sweep, an expired) lease, an available message.
:data:`GUARDS` lists each (statement, guard) with the predicate that is the guard and a
behavioural check through the public service API: the check passes when the guard holds.

:func:`test_each_check_notices_its_guard_removed` is the proof: it renders the statement
with that predicate made always true (the guard removed), has the engine run that text, and
expects the check to fail. :func:`test_every_fenced_statement_has_a_check_per_guard` makes
the table complete: a statement that gains a guard, or a new fenced statement, fails the
suite until its checks are written.

Every exit from ``processing`` clears the lease token and expiry, so the status guards of
token-fenced statements are a second line behind the token: their checks forge the one row
only they catch (one that left ``processing`` with its lease columns kept, as a transition
that forgot to clear them would leave it) with an UPDATE, as expiries are forged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection

from tests.support import expire_leases
from zeroloss.ledger import statements
from zeroloss.ledger.base import engine_for
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import Completion, Lease, Verdict, ZeroLossMessageService
from zeroloss.ledger.workflow_graph import StepSpec

QUEUE = "guards"

#: Being replaced by the lead's rewrite of the transactional batch (ACK/FAIL fenced by expiry
#: inside its transaction): not checked here, and left out of the completeness test.
BEING_REMOVED = frozenset(
    {
        "LOCK_HELD",
        "ACK_LOCKED",
        "FAIL_LOCKED",
        "FAIL_FINAL_LOCKED",
        "SNOOZE_LOCKED",
        "CANCEL_ABORTED_LOCKED",
    }
)

#: How each kind of guard reads in a statement's WHERE clause (the clock: any engine fragment
#: or SQL function, so a clock other than ``{now}`` still matches).
GUARD_KINDS = {
    "token": r"(?:\{msg\}\.)?lease_token = (?:b\.tok|%s|%\(\w+\)s)|b\.tok = lease_token",
    "status": r"(?:\{msg\}\.)?\bstatus = (?:'[a-z]+'|%s|%\(\w+\)s)",
    "expiry": r"(?:\{msg\}\.)?lease_expires_at [<>] (?:\{\w+\}|\w+\(\))",
    "available": r"(?:\{msg\}\.)?available_at <= (?:\{\w+\}|\w+\(\))",
    "owner": r"(?:\{msg\}\.)?claimed_by = (?:%s|%\(\w+\)s)",
    "abort": r"(?:\{msg\}\.)?abort_requested_at IS (?:NOT )?NULL",
}
#: A statement is fenced when it moves a message or compares a lease column.
_MOVES = re.compile(r"SET status =")
_LEASE_COMPARED = re.compile(r"lease_token = |= lease_token|lease_expires_at [<>]")


class GuardBreached(AssertionError):
    """What a check raises when the statement did what its guard forbids (a failed set-up step
    is a plain AssertionError, and does not count as noticing a removed guard)."""


def expect(condition: object, breach: object) -> None:
    if not condition:
        raise GuardBreached(str(breach))


def predicates(template: str) -> tuple[str, str]:
    """A statement split before its first WHERE: (what it sets, what it checks)."""
    head, where, tail = (
        re.split(r"(\sWHERE\s)", template, maxsplit=1)
        if re.search(r"\sWHERE\s", template)
        else (template, "", "")
    )
    return head + where, tail


def catalogue() -> dict[str, str]:
    """Every named statement of the catalogue: its templates, and its statements written whole
    (as PostgreSQL runs them: the same predicates as SQLite's, a clock spelled as a function)."""
    templates = {
        name: value
        for name, value in vars(statements).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, str)
    }
    whole = {name: texts["postgresql"] for c in statements.WHOLE for name, texts in c.statements.items()}
    return {**templates, **whole}


def fenced_guards() -> set[tuple[str, str]]:
    """(statement, guard kind) for every guard of every fenced statement in the catalogue now."""
    found = set()
    for name, template in catalogue().items():
        if name in BEING_REMOVED:
            continue
        _, checked = predicates(template)
        if not (_MOVES.search(template) or _LEASE_COMPARED.search(checked)):
            continue
        found |= {(name, kind) for kind, pattern in GUARD_KINDS.items() if re.search(pattern, checked)}
    return found


# -- the database, as the checks set it up --------------------------------------------------


def _past(seconds: float = 60.0) -> tuple[str, list[Any]]:
    if connection.vendor == "postgresql":
        return "statement_timestamp() - %s * interval '1 second'", [seconds]
    return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)", [f"-{seconds:.6f} seconds"]


def forge(message_id: str, *, status: str | None = None, lease_expired: bool = False) -> None:
    """Put a row in a state no transition leaves, keeping its lease columns (see the module doc)."""
    sets: list[str] = []
    params: list[Any] = []
    if status is not None:
        sets.append("status = %s")
        params.append(status)
    if lease_expired:
        past, past_params = _past()
        sets.append(f"lease_expires_at = {past}")
        params += past_params
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Message._meta.db_table} SET {', '.join(sets)} WHERE message_id = %s",
            [*params, message_id],
        )
        assert cursor.rowcount == 1


def snapshot(message_ids: Sequence[str]) -> list[tuple[object, ...]]:
    rows = Message.objects.filter(message_id__in=message_ids).order_by("message_id")
    return [
        (
            *row,
            MessageEvent.objects.filter(message__message_id=row[0]).count(),
        )
        for row in rows.values_list(
            "message_id",
            "status",
            "attempts",
            "lease_token",
            "lease_expires_at",
            "available_at",
            "updated_at",
        )
    ]


@contextmanager
def untouched(*message_ids: str) -> Iterator[None]:
    """The rows (and their audit trails) are exactly as they were when the block ends."""
    before = snapshot(message_ids)
    yield
    after = snapshot(message_ids)
    expect(
        after == before, f"the statement moved a row its guard should have left alone: {before} -> {after}"
    )


@contextmanager
def writes_seen() -> Iterator[list[str]]:
    """The statements that write (UPDATE), as the connection ran them."""
    seen: list[str] = []

    def wrapper(execute, sql, params, many, context):
        if "UPDATE " in sql.upper():
            seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield seen


def held(svc: ZeroLossMessageService, message_id: str) -> Lease:
    svc.persist_message(message_id, QUEUE, {"id": message_id})
    lease = svc.claim_message(message_id)
    assert lease is not None
    return lease


def stale(svc: ZeroLossMessageService, message_id: str) -> Lease:
    """The lease of a holder whose lease expired, was swept, and was claimed again by another."""
    old = held(svc, message_id)
    expire_leases([message_id])
    assert message_id in svc.sweep().requeued
    assert svc.claim_message(message_id) is not None
    return old


def completed(svc: ZeroLossMessageService, message_id: str) -> None:
    lease = held(svc, message_id)
    assert svc.acknowledge(message_id, lease.token)


# -- the checks: each passes while its guard holds --------------------------------------------


def _steps(svc: ZeroLossMessageService, policy: str = "wait") -> None:
    """A workflow ``w``: step A, and D waiting for it."""
    svc.workflows.store(
        "w", [StepSpec("A", QUEUE, {}), StepSpec("D", QUEUE, {}, after=("A",), on_upstream_failure=policy)]
    )


def step_release_leaves_cancelled(svc: ZeroLossMessageService) -> None:
    _steps(svc)
    svc.cancel_messages(["w/D"])
    lease = svc.claim_message("w/A")
    assert lease is not None and lease.workflow_id == "w"
    svc.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE)])
    status = Message.objects.get(message_id="w/D").status
    expect(status == Status.CANCELLED, f"a cancelled step was released: {status}")


def step_cancel_leaves_pending(svc: ZeroLossMessageService) -> None:
    _steps(svc, policy="cancel")
    forge("w/D", status=Status.PENDING)
    lease = svc.claim_message("w/A")
    assert lease is not None
    with untouched("w/D"):
        svc.record_outcomes([Completion(lease, Verdict.FAIL_FINAL, error="no")])


def step_release_stranded_leaves_completed(svc: ZeroLossMessageService) -> None:
    completed(svc, "m")
    with untouched("m"):
        svc.workflows.release_stranded([Message.objects.get(message_id="m").pk])


# A lease-holder outcome, refused for a lease that is no longer held. Each returns whether it
# was recorded.
Outcome = Callable[[ZeroLossMessageService, Lease], bool]


def _renew(svc: ZeroLossMessageService, lease: Lease) -> bool:
    return svc.renew_lease(lease.message_id, lease.token)


def _busy(svc: ZeroLossMessageService, lease: Lease) -> bool:
    # What the keeper asks of a lease its renewal skipped: still held, only locked elsewhere.
    return lease.message_id in svc.busy_leases([lease])


def _revive(svc: ZeroLossMessageService, lease: Lease) -> bool:
    # What a worker asks of leases its claim handed back already expired (a slow commit).
    return lease.message_id in svc.revive_leases([lease])


def _ack_one(svc: ZeroLossMessageService, lease: Lease) -> bool:
    return svc.acknowledge(lease.message_id, lease.token, result={"ok": True})


def _ack_batch(svc: ZeroLossMessageService, lease: Lease) -> bool:
    report = svc.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE, result={"ok": True})])
    assert report.refused or report.acknowledged or report.cancelled
    return bool(report.acknowledged)


def _fail_batch(svc: ZeroLossMessageService, lease: Lease) -> bool:
    report = svc.record_outcomes([Completion(lease, Verdict.FAIL, error="handler raised")])
    return not report.refused


def _snooze(svc: ZeroLossMessageService, lease: Lease) -> bool:
    report = svc.record_outcomes([Completion(lease, Verdict.SNOOZE, "zeroloss.Snooze: for 60 s", delay=60)])
    return bool(report.snoozed)


def _fail_final(svc: ZeroLossMessageService, lease: Lease) -> bool:
    report = svc.record_outcomes([Completion(lease, Verdict.FAIL_FINAL, error="zeroloss.Fail: gone")])
    assert report.refused or report.dead_lettered or report.cancelled
    return bool(report.dead_lettered)


def _release(svc: ZeroLossMessageService, lease: Lease) -> bool:
    return svc.release(lease.message_id, lease.token)


def _fail_one(svc: ZeroLossMessageService, lease: Lease) -> bool:
    return svc.fail(lease.message_id, lease.token, "handler raised")


def stale_token_refused(outcome: Outcome) -> Callable[[ZeroLossMessageService], None]:
    def check(svc: ZeroLossMessageService) -> None:
        old = stale(svc, "m")
        with untouched("m"):
            expect(
                not outcome(svc, old),
                "a stale lease token's outcome was recorded over the new holder's lease",
            )

    return check


def left_processing_refused(outcome: Outcome) -> Callable[[ZeroLossMessageService], None]:
    def check(svc: ZeroLossMessageService) -> None:
        lease = held(svc, "m")
        forge("m", status="completed")
        with untouched("m"):
            expect(not outcome(svc, lease), "an outcome was recorded for a message no longer processing")

    return check


def expired_refused(outcome: Outcome) -> Callable[[ZeroLossMessageService], None]:
    def check(svc: ZeroLossMessageService) -> None:
        lease = held(svc, "m")
        expire_leases(["m"])
        with untouched("m"):
            expect(not outcome(svc, lease), "an expired lease's outcome was recorded")

    return check


def revive_leaves_aborted(svc: ZeroLossMessageService) -> None:
    # Expired and aborted: the sweep's, which cancels it; a revival would hand it back to run.
    lease = held(svc, "m")
    expire_leases(["m"])
    _request_abort("m")
    with untouched("m"):
        expect(not _revive(svc, lease), "an aborted message's expired lease was revived")


def refused_before_writing(setup: Callable[[ZeroLossMessageService], Lease]) -> Callable[..., None]:
    """fail reads the holder's attempt (LEASED_ATTEMPT) before it writes: a caller that
    holds no lease is refused by that read, and never sends the FAIL that would wait on the row
    lock of the message's real holder."""

    def check(svc: ZeroLossMessageService) -> None:
        lease = setup(svc)
        with untouched("m"), writes_seen() as writes:
            expect(not _fail_one(svc, lease), "a caller without the lease recorded a failure")
        expect(not writes, f"a caller without the lease got past the attempt read: {writes}")

    return check


def _stale_lease(svc: ZeroLossMessageService) -> Lease:
    return stale(svc, "m")


def _completed_keeping_lease(svc: ZeroLossMessageService) -> Lease:
    lease = held(svc, "m")
    forge("m", status="completed")
    return lease


def release_unknown_leaves_completed(svc: ZeroLossMessageService) -> None:
    held(svc, "m")
    forge("m", status="completed")
    with untouched("m"):
        expect(svc.release_unknown_claims([]) == [], "a completed message was put back to pending")


def release_unknown_leaves_expired(svc: ZeroLossMessageService) -> None:
    # An expired lease is the sweep's: it counts the attempt, a release would not.
    held(svc, "m")
    expire_leases(["m"])
    with untouched("m"):
        expect(svc.release_unknown_claims([]) == [], "an expired lease was released, its attempt uncounted")


def release_unknown_leaves_other_claimers(svc: ZeroLossMessageService) -> None:
    held(ZeroLossMessageService(instance_id="another-worker"), "m")
    with untouched("m"):
        expect(svc.release_unknown_claims([]) == [], "another worker's live lease was released")


def release_unknown_keeps_held_leases(svc: ZeroLossMessageService) -> None:
    lease = held(svc, "m")
    with untouched("m"):
        expect(svc.release_unknown_claims([lease]) == [], "a lease the claimer holds was released")


def sweep_leaves_live_leases(svc: ZeroLossMessageService) -> None:
    held(svc, "live")
    held(svc, "gone")
    expire_leases(["gone"])
    with untouched("live"):
        report = svc.sweep()
    expect(report.requeued == ["gone"], f"the sweep moved a live lease: {report}")


def sweep_leaves_rows_not_processing(svc: ZeroLossMessageService) -> None:
    # An expired lease as well, so that SQLite's sweep (gated by ANY_EXPIRED) runs its UPDATE.
    held(svc, "gone")
    expire_leases(["gone"])
    held(svc, "done")
    forge("done", status="completed", lease_expired=True)
    svc.persist_message("waiting", QUEUE, {})
    forge("waiting", lease_expired=True)
    with untouched("done", "waiting"):
        report = svc.sweep()
    expect(report.requeued == ["gone"], f"the sweep moved a row that was not processing: {report}")


def sweep_writes_nothing_without_expired_leases(setup: Callable[[ZeroLossMessageService], None]) -> Callable:
    """On SQLite the sweep asks ANY_EXPIRED before it takes the database's one write lock."""

    def check(svc: ZeroLossMessageService) -> None:
        if connection.vendor != "sqlite":
            pytest.skip("only SQLite's sweep asks ANY_EXPIRED first (PostgreSQL sweeps under SKIP LOCKED)")
        setup(svc)
        with writes_seen() as writes:
            expect(svc.sweep().total == 0, "the sweep moved a row with no lease expired")
        expect(not writes, f"the sweep took the write lock with no lease expired: {writes}")

    return check


def _live_lease(svc: ZeroLossMessageService) -> None:
    held(svc, "live")


def _completed_with_expired_lease(svc: ZeroLossMessageService) -> None:
    held(svc, "done")
    forge("done", status="completed", lease_expired=True)


def force_requeue_leaves_completed(svc: ZeroLossMessageService) -> None:
    completed(svc, "m")
    with untouched("m"):
        expect(svc.requeue_messages(["m"], force=True) == [], "a completed message was requeued")


def stuck_requeue_leaves_completed(svc: ZeroLossMessageService) -> None:
    held(svc, "m")
    forge("m", status="completed", lease_expired=True)
    with untouched("m"):
        expect(svc.requeue_messages(["m"]) == [], "a completed message was requeued")


def stuck_requeue_leaves_live_leases(svc: ZeroLossMessageService) -> None:
    held(svc, "m")
    with untouched("m"):
        expect(svc.requeue_messages(["m"]) == [], "a live lease was revoked without force")


def redrive_leaves_completed(svc: ZeroLossMessageService) -> None:
    completed(svc, "m")
    with untouched("m"):
        expect(svc.redrive_messages(["m"]) == [], "a completed message was redriven")


def dead_letter_leaves_completed(svc: ZeroLossMessageService) -> None:
    completed(svc, "m")
    with untouched("m"):
        expect(
            svc.dead_letter_messages(["m"], reason="by hand") == [], "a completed message was dead-lettered"
        )


def claim_leaves_held(claim: Callable[[ZeroLossMessageService], object]) -> Callable[..., None]:
    def check(svc: ZeroLossMessageService) -> None:
        held(svc, "m")
        with untouched("m"):
            expect(not claim(svc), "a message already processing was claimed again")

    return check


def claim_leaves_delayed(claim: Callable[[ZeroLossMessageService], object]) -> Callable[..., None]:
    def check(svc: ZeroLossMessageService) -> None:
        svc.persist_message("m", QUEUE, {}, delay=3600)
        with untouched("m"):
            expect(not claim(svc), "a delayed message was claimed before its time")

    return check


def _claim_next(svc: ZeroLossMessageService) -> object:
    return svc.claim(QUEUE, limit=10)


def _claim_limited(svc: ZeroLossMessageService) -> object:
    """A claim under a concurrency limit not reached, on the exact path (statement CLAIM_LIMITED):
    a limit too small for slot shares, so PostgreSQL does not take the slot path (which runs CLAIM)."""
    svc.limit_queue(QUEUE, concurrency=12)
    return svc.claim(QUEUE, limit=10)


def _claim_by_id(svc: ZeroLossMessageService) -> object:
    return svc.claim_message("m")


def _request_abort(message_id: str) -> None:
    """An operator's abort request on the row, whatever its status (its lease columns kept)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Message._meta.db_table} SET abort_requested_at = created_at WHERE message_id = %s",
            [message_id],
        )


def _cancel_aborted(svc: ZeroLossMessageService, lease: Lease) -> bool:
    # The outcome of an aborted message: the abort requested first, so only the guard decides.
    _request_abort(lease.message_id)
    return bool(svc.aborts.cancel_aborted([lease.message_id], [svc.engine.token(lease.token)]))


def _aborts_requested(svc: ZeroLossMessageService, lease: Lease) -> bool:
    _request_abort(lease.message_id)
    return bool(svc.aborts_requested([lease]))


def aborted_outcome_is_cancelled(outcome: Outcome) -> Callable[[ZeroLossMessageService], None]:
    """An aborted message's handler ended: whatever it reports, the message ends cancelled."""

    def check(svc: ZeroLossMessageService) -> None:
        lease = held(svc, "m")
        assert svc.cancel_messages(["m"], abort=True)[0].outcome == "abort_requested"
        outcome(svc, lease)
        got = Message.objects.get(message_id="m").status
        expect(got == "cancelled", f"an aborted message's outcome was recorded as {got}")

    return check


def cancel_leaves_processing(svc: ZeroLossMessageService) -> None:
    lease = held(svc, "m")
    with untouched("m"):
        expect(svc.cancel_messages(["m"])[0].outcome == "running", "a processing message was cancelled")
    expect(svc.renew_lease("m", lease.token), "the holder lost its lease to a cancel")


def abort_request_leaves_completed(svc: ZeroLossMessageService) -> None:
    completed(svc, "m")
    with untouched("m"):
        result = svc.cancel_messages(["m"], abort=True)[0]
    expect(result.outcome == "finished", f"an abort was requested on a completed message: {result}")


def abort_request_is_recorded_once(svc: ZeroLossMessageService) -> None:
    held(svc, "m")
    svc.cancel_messages(["m"], abort=True)
    with untouched("m"):
        result = svc.cancel_messages(["m"], abort=True)[0]
    expect(result.outcome == "abort_already_requested", f"an abort was requested twice: {result}")


def not_aborted_is_not_reported(svc: ZeroLossMessageService) -> None:
    lease = held(svc, "m")
    expect(not svc.aborts_requested([lease]), "a message nobody aborted was reported aborted")


def not_aborted_is_not_cancelled(svc: ZeroLossMessageService) -> None:
    lease = held(svc, "m")
    with untouched("m"):
        moved = svc.aborts.cancel_aborted(["m"], [svc.engine.token(lease.token)])
    expect(not moved, "a message nobody aborted was recorded cancelled")


# -- the table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Guard:
    statement: str
    kind: str
    #: The predicate that is the guard, as the template spells it (``{now}`` matches any clock).
    predicate: str
    check: Callable[[ZeroLossMessageService], None]
    #: What the predicate becomes when the guard is removed (default: always true; a ``%s``
    #: predicate keeps its parameter).
    removed: str | None = None

    @property
    def id(self) -> str:
        return f"{self.statement}-{self.kind}"


_TOKEN, _PROCESSING, _UNEXPIRED = "lease_token = b.tok", "status = 'processing'", "lease_expires_at > {now}"
_EXPIRED, _PENDING, _AVAILABLE = "lease_expires_at < {now}", "status = 'pending'", "available_at <= {now}"
_WAITING = "status = 'waiting'"


def _holder_outcome(statement: str, outcome: Outcome, token: str = _TOKEN) -> list[Guard]:
    return [
        Guard(statement, "token", token, stale_token_refused(outcome)),
        Guard(statement, "status", _PROCESSING, left_processing_refused(outcome)),
        Guard(statement, "expiry", _UNEXPIRED, expired_refused(outcome)),
    ]


GUARDS: list[Guard] = [
    *_holder_outcome("RENEW", _renew),
    *_holder_outcome("RENEW_BUSY", _busy),
    # Not fenced by the expiry: a revival is of a lease that ran out (tests/ledger/test_revival.py).
    Guard("REVIVE", "token", _TOKEN, stale_token_refused(_revive)),
    Guard("REVIVE", "status", _PROCESSING, left_processing_refused(_revive)),
    Guard("REVIVE", "abort", "abort_requested_at IS NULL", revive_leaves_aborted),
    *_holder_outcome("ACK", _ack_batch),
    *_holder_outcome("ACK_ONE", _ack_one, token="lease_token = %s"),
    *_holder_outcome("FAIL", _fail_batch),
    *_holder_outcome("RELEASE", _release),
    *_holder_outcome("SNOOZE", _snooze),
    *_holder_outcome("FAIL_FINAL", _fail_final),
    *(
        Guard(name, "abort", "abort_requested_at IS NULL", aborted_outcome_is_cancelled(outcome))
        for name, outcome in (
            ("ACK", _ack_batch),
            ("ACK_ONE", _ack_one),
            ("FAIL", _fail_batch),
            ("RELEASE", _release),
            ("SNOOZE", _snooze),
            ("FAIL_FINAL", _fail_final),
        )
    ),
    *_holder_outcome("CANCEL_ABORTED", _cancel_aborted),
    Guard("CANCEL_ABORTED", "abort", "abort_requested_at IS NOT NULL", not_aborted_is_not_cancelled),
    Guard("ABORTS_REQUESTED", "token", _TOKEN, stale_token_refused(_aborts_requested)),
    Guard("ABORTS_REQUESTED", "status", _PROCESSING, left_processing_refused(_aborts_requested)),
    Guard("ABORTS_REQUESTED", "abort", "abort_requested_at IS NOT NULL", not_aborted_is_not_reported),
    Guard("CANCEL", "status", _PENDING, cancel_leaves_processing),
    Guard("STEP_CANCEL_BY_OPERATOR", "status", _WAITING, cancel_leaves_processing),
    Guard("STEP_RELEASE", "status", _WAITING, step_release_leaves_cancelled),
    Guard("STEP_CANCEL", "status", _WAITING, step_cancel_leaves_pending),
    Guard("STEP_RELEASE_STRANDED", "status", _WAITING, step_release_stranded_leaves_completed),
    Guard("ABORT_REQUEST", "status", _PROCESSING, abort_request_leaves_completed),
    Guard("ABORT_REQUEST", "abort", "abort_requested_at IS NULL", abort_request_is_recorded_once),
    Guard("LEASED_ATTEMPT", "token", "lease_token = %s", refused_before_writing(_stale_lease)),
    Guard("LEASED_ATTEMPT", "status", _PROCESSING, refused_before_writing(_completed_keeping_lease)),
    Guard("RELEASE_UNKNOWN", "status", _PROCESSING, release_unknown_leaves_completed),
    Guard("RELEASE_UNKNOWN", "expiry", _UNEXPIRED, release_unknown_leaves_expired),
    Guard("RELEASE_UNKNOWN", "owner", "claimed_by = %s", release_unknown_leaves_other_claimers),
    # The leases it knows are exempted by NOT EXISTS (... WHERE b.tok = lease_token): without
    # that guard none is.
    Guard(
        "RELEASE_UNKNOWN", "token", "b.tok = lease_token", release_unknown_keeps_held_leases, removed="false"
    ),
    Guard("SWEEP", "status", _PROCESSING, sweep_leaves_rows_not_processing),
    Guard("SWEEP", "expiry", _EXPIRED, sweep_leaves_live_leases),
    Guard(
        "ANY_EXPIRED",
        "status",
        _PROCESSING,
        sweep_writes_nothing_without_expired_leases(_completed_with_expired_lease),
    ),
    Guard("ANY_EXPIRED", "expiry", _EXPIRED, sweep_writes_nothing_without_expired_leases(_live_lease)),
    Guard("REQUEUE", "status", _PROCESSING, force_requeue_leaves_completed),
    Guard("REQUEUE_STUCK", "status", _PROCESSING, stuck_requeue_leaves_completed),
    Guard("REQUEUE_STUCK", "expiry", _EXPIRED, stuck_requeue_leaves_live_leases),
    Guard("REDRIVE", "status", "status = 'dead'", redrive_leaves_completed),
    Guard("DEAD_LETTER_PENDING", "status", _PENDING, dead_letter_leaves_completed),
    Guard("DEAD_LETTER_PROCESSING", "status", _PROCESSING, dead_letter_leaves_completed),
    Guard("CLAIM", "status", _PENDING, claim_leaves_held(_claim_next)),
    Guard("CLAIM", "available", _AVAILABLE, claim_leaves_delayed(_claim_next)),
    Guard("CLAIM_LIMITED", "status", _PENDING, claim_leaves_held(_claim_limited)),
    Guard("CLAIM_LIMITED", "available", _AVAILABLE, claim_leaves_delayed(_claim_limited)),
    Guard("CLAIM_BY_ID", "status", _PENDING, claim_leaves_held(_claim_by_id)),
    Guard("CLAIM_BY_ID", "available", _AVAILABLE, claim_leaves_delayed(_claim_by_id)),
]


#: A clock as a template or a statement written whole spells it: a fragment, an SQL function,
#: SQLite's strftime of now.
_CLOCK = r"(?:\{\w+\}|\w+\(\)|strftime\('[^']*', 'now'\))"
_PARAMETER = r"(?:%s|%\(\w+\)s)"


def _predicate_pattern(predicate: str) -> str:
    """The predicate as a regular expression: with its optional table prefix (a template's, or
    the table's name), any clock, a positional or named parameter."""
    pattern = re.escape(predicate)
    pattern = re.sub(r"\\\{\w+\\\}", lambda _: _CLOCK, pattern)
    pattern = pattern.replace("%s", _PARAMETER)
    return r"(?:\{msg\}\.|zeroloss_message\.)?" + pattern


def without_guard(template: str, guard: Guard) -> str:
    """The statement with every occurrence of the guard's predicate made always true."""

    def removed(found: re.Match[str]) -> str:
        if guard.removed is not None:
            return guard.removed
        # A predicate on a parameter keeps it, so the statement's parameters stay the same.
        parameter = re.search(_PARAMETER, found[0]) if "%s" in guard.predicate else None
        return f"CAST({parameter[0]} AS TEXT) IS NOT NULL" if parameter else "true"

    sets, checked = predicates(template)
    mutated, count = re.subn(_predicate_pattern(guard.predicate), removed, checked)
    assert count, f"{guard.statement} no longer checks {guard.predicate!r}: update GUARDS"
    return sets + mutated


@contextmanager
def catalogue_without(guard: Guard) -> Iterator[None]:
    """The engine runs ``guard.statement`` without its guard until the block ends.

    Engines read each statement once (``Engine.sql``) and cache what they compose from it
    (``Engine._composed``: PostgreSQL's audit wrapper): the text is replaced and the cache
    cleared, both ways.
    """
    engine = engine_for(connection)
    original = engine.sql[guard.statement]
    engine.sql[guard.statement] = without_guard(original, guard)  # as this database runs it
    assert engine.sql[guard.statement] != original
    engine._composed.clear()
    try:
        yield
    finally:
        engine.sql[guard.statement] = original
        engine._composed.clear()


@pytest.fixture
def svc(db: None) -> ZeroLossMessageService:
    return ZeroLossMessageService(instance_id="guards-worker")


def _present(guard: Guard) -> None:
    # A statement taken out of the catalogue takes its entries out of GUARDS with it.
    if guard.statement not in catalogue():
        pytest.fail(f"{guard.statement} is no longer in the statement catalogue: remove its GUARDS entries")


@pytest.mark.parametrize("guard", GUARDS, ids=lambda g: g.id)
def test_each_guard_holds(svc, guard):
    _present(guard)
    guard.check(svc)


@pytest.mark.parametrize("guard", GUARDS, ids=lambda g: g.id)
def test_each_check_notices_its_guard_removed(svc, guard):
    _present(guard)
    with catalogue_without(guard), pytest.raises(GuardBreached) as breach:
        guard.check(svc)
    assert str(breach.value)


def test_every_fenced_statement_has_a_check_per_guard():
    tabled = {(g.statement, g.kind) for g in GUARDS}
    missing = sorted(fenced_guards() - tabled)
    assert not missing, (
        f"fenced statements with a guard no check covers: {missing}; add a Guard to GUARDS for each "
        "(a behavioural check that fails when the predicate is removed)"
    )
    # The detection itself sees the statements the table was written for.
    assert {("ACK", "token"), ("SWEEP", "expiry"), ("CLAIM", "available")} <= fenced_guards()


def test_a_new_fenced_statement_needs_its_checks(monkeypatch):
    """The completeness test sees a statement it was not written for, and each of its guards."""
    monkeypatch.setattr(statements, "ACK_AGAIN", catalogue()["ACK"], raising=False)
    assert {("ACK_AGAIN", kind) for kind in ("token", "status", "expiry")} <= fenced_guards()
    assert not {g for g in fenced_guards() if g[0] == "PROMOTE"}  # moves no status, no lease


def test_the_mutation_removes_only_the_guard():
    """Removing a guard leaves the rest of the statement, its SET clause and its parameters, alone."""
    ack_one = next(g for g in GUARDS if g.id == "ACK_ONE-token")
    written = catalogue()["ACK_ONE"]
    mutated = without_guard(written, ack_one)
    assert "lease_token = %(tok)s" not in mutated
    assert sorted(re.findall(_PARAMETER, mutated)) == sorted(re.findall(_PARAMETER, written))
    assert predicates(mutated)[0] == predicates(written)[0]
    claim = next(g for g in GUARDS if g.id == "CLAIM-status")
    assert "status = 'pending'" not in without_guard(catalogue()["CLAIM"], claim)
    assert "SET status = 'processing'" in without_guard(catalogue()["CLAIM"], claim)
