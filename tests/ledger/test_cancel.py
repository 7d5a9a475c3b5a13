"""Cancel and abort through the ledger, on both databases: every case, keys, fencing, verify."""

from __future__ import annotations

import json

import pytest

import zeroloss
from tests.support import backdate, expire_leases
from tests.support.cli import run
from zeroloss.exceptions import InvalidMessage, MessageNotFound
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ledger.types import CancelOutcome, Completion, Verdict

pytestmark = pytest.mark.django_db(transaction=True)

Q = "cancel-q"


def worker(name: str = "w1") -> ZeroLossMessageService:
    return ZeroLossMessageService(instance_id=name, ack_timeout=600)


def status(mid: str) -> str:
    return Message.objects.get(message_id=mid).status


def reasons(mid: str) -> list[tuple[str, str, str, str]]:
    return list(
        MessageEvent.objects.for_message(mid).values_list("from_status", "to_status", "reason", "actor")
    )


# -- pending, delayed, waiting ---------------------------------------------------------------


def test_pending_message_is_cancelled_with_its_audit_row() -> None:
    service = worker()
    service.persist_message("p1", Q, {"n": 1})
    result = zeroloss.cancel("p1", actor="alice")
    assert result.outcome == CancelOutcome.CANCELLED and result.ok and result.status == "cancelled"
    assert status("p1") == Status.CANCELLED
    assert reasons("p1")[-1] == ("pending", "cancelled", "cancelled_by_operator", "alice")
    assert service.claim(Q, 10) == []  # never claimed


def test_delayed_message_is_cancelled_and_never_runs() -> None:
    service = worker()
    service.persist_message("d1", Q, {}, delay=3600)
    assert zeroloss.cancel("d1").outcome == CancelOutcome.CANCELLED
    Message.objects.filter(message_id="d1").update(
        available_at=Message.objects.get(message_id="d1").created_at
    )
    assert service.claim(Q, 10) == []


def test_cancelling_the_head_of_a_key_promotes_the_next() -> None:
    service = worker()
    for i in range(3):
        service.persist_message(f"k{i}", Q, {"i": i}, ordering_key="acct")
    assert Message.objects.get(message_id="k1").available_at is None  # waiting behind k0
    assert zeroloss.cancel("k0").outcome == CancelOutcome.CANCELLED
    assert Message.objects.get(message_id="k1").available_at is not None  # the next head
    leases = service.claim(Q, 10)
    assert [x.message_id for x in leases] == ["k1"]


def test_cancelling_a_waiting_message_leaves_the_key_in_order() -> None:
    service = worker()
    for i in range(3):
        service.persist_message(f"w{i}", Q, {"i": i}, ordering_key="acct")
    assert zeroloss.cancel("w1").outcome == CancelOutcome.CANCELLED
    (head,) = service.claim(Q, 10)
    assert head.message_id == "w0"
    assert service.record_outcomes([Completion(head, Verdict.ACKNOWLEDGE)]).acknowledged == ["w0"]
    service.promote_keys([(Q, "acct")])
    assert [x.message_id for x in service.claim(Q, 10)] == ["w2"]


# -- processing, finished, unknown -------------------------------------------------------------


def test_processing_without_abort_is_left_alone() -> None:
    service = worker()
    service.persist_message("r1", Q, {})
    (lease,) = service.claim(Q)
    result = zeroloss.cancel("r1")
    assert result.outcome == CancelOutcome.RUNNING and not result.ok
    assert status("r1") == Status.PROCESSING
    assert Message.objects.get(message_id="r1").abort_requested_at is None
    assert service.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE)]).acknowledged == ["r1"]


@pytest.mark.parametrize("verdict", [Verdict.ACKNOWLEDGE, Verdict.FAIL, Verdict.RELEASE])
def test_abort_makes_any_outcome_cancelled(verdict: Verdict) -> None:
    service = ZeroLossMessageService(instance_id="w1", ack_timeout=600, max_attempts=1)
    service.persist_message("a1", Q, {})
    (lease,) = service.claim(Q)
    result = zeroloss.cancel("a1", abort=True, actor="bob")
    assert result.outcome == CancelOutcome.ABORT_REQUESTED and result.status == "processing"
    assert service.aborts_requested([lease]) == {"a1"}
    again = zeroloss.cancel("a1", abort=True)
    assert again.outcome == CancelOutcome.ABORT_ALREADY_REQUESTED and not again.ok
    report = service.record_outcomes([Completion(lease, verdict, "boom")])
    assert report.cancelled == ["a1"] and not report.refused and not report.acknowledged
    assert status("a1") == Status.CANCELLED
    assert reasons("a1")[-2:] == [
        ("processing", "processing", "abort_requested", "bob"),
        ("processing", "cancelled", "aborted", "w1"),
    ]


def test_single_outcome_calls_record_an_abort_as_cancelled() -> None:
    service = worker()
    service.persist_message("s1", Q, {})
    service.persist_message("s2", Q, {})
    first, second = service.claim(Q, 2)
    zeroloss.cancel(first.message_id, abort=True)
    zeroloss.cancel(second.message_id, abort=True)
    assert service.acknowledge(first.message_id, first.token) is False
    assert service.fail(second.message_id, second.token, "x") is False
    assert status(first.message_id) == status(second.message_id) == Status.CANCELLED


def test_finished_and_cancelled_are_reported_unchanged() -> None:
    service = ZeroLossMessageService(instance_id="w1", ack_timeout=600, max_attempts=1)
    for mid in ("c1", "x1", "z1"):
        service.persist_message(mid, Q, {})
    done, dead = service.claim(Q, 2)
    service.record_outcomes([Completion(done, Verdict.ACKNOWLEDGE), Completion(dead, Verdict.FAIL, "boom")])
    zeroloss.cancel("z1")
    for mid, outcome in (
        (done.message_id, CancelOutcome.FINISHED),
        (dead.message_id, CancelOutcome.FINISHED),
        ("z1", CancelOutcome.ALREADY_CANCELLED),
    ):
        before = reasons(mid)
        result = zeroloss.cancel(mid, abort=True)
        assert result.outcome == outcome and not result.ok
        assert reasons(mid) == before


def test_unknown_or_malformed_id_changes_nothing() -> None:
    service = worker()
    service.persist_message("u1", Q, {})
    with pytest.raises(MessageNotFound):
        service.cancel_messages(["u1", "nope"])
    with pytest.raises(InvalidMessage):
        service.cancel_messages(["u1", ""])
    with pytest.raises(InvalidMessage):
        service.cancel_messages("u1")  # one string is not a list of ids
    assert status("u1") == Status.PENDING


def test_several_ids_are_reported_each() -> None:
    service = worker()
    for mid in ("m1", "m2", "m3"):
        service.persist_message(mid, Q, {})
    service.claim_message("m2")
    results = service.cancel_messages(["m3", "m2", "m1"])
    assert [(r.message_id, r.outcome) for r in results] == [
        ("m3", CancelOutcome.CANCELLED),
        ("m2", CancelOutcome.RUNNING),
        ("m1", CancelOutcome.CANCELLED),
    ]


# -- fencing ------------------------------------------------------------------------------------


def test_a_stale_worker_cannot_record_over_a_cancel() -> None:
    stale, fresh = worker("stale"), worker("fresh")
    stale.persist_message("f1", Q, {})
    (old,) = stale.claim(Q)
    expire_leases(["f1"])
    stale.sweep()  # back to pending
    assert zeroloss.cancel("f1").outcome == CancelOutcome.CANCELLED
    report = stale.record_outcomes([Completion(old, Verdict.ACKNOWLEDGE)])
    assert report.refused == ["f1"] and not report.cancelled
    assert stale.acknowledge("f1", old.token) is False
    assert fresh.claim(Q) == []
    assert status("f1") == Status.CANCELLED


def test_an_aborted_message_whose_lease_expired_is_not_recorded_by_its_worker() -> None:
    service = worker()
    service.persist_message("e1", Q, {})
    (lease,) = service.claim(Q)
    zeroloss.cancel("e1", abort=True)
    expire_leases(["e1"])
    report = service.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE)])
    assert report.refused == ["e1"] and not report.cancelled  # fenced: the lease ran out
    assert status("e1") == Status.PROCESSING


def test_cancel_cannot_land_on_a_message_another_worker_holds() -> None:
    holder = worker("holder")
    holder.persist_message("h1", Q, {})
    (lease,) = holder.claim(Q)
    assert zeroloss.cancel("h1").outcome == CancelOutcome.RUNNING
    assert holder.renew_leases([lease]) == {"h1"}
    assert holder.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE)]).acknowledged == ["h1"]


def test_the_sweep_cancels_an_aborted_message_whose_worker_died() -> None:
    service = worker()
    for i in range(2):
        service.persist_message(f"o{i}", Q, {"i": i}, ordering_key="key")
    (lease,) = service.claim(Q)
    zeroloss.cancel(lease.message_id, abort=True)
    expire_leases([lease.message_id])
    report = service.sweep()
    assert report.cancelled == ["o0"] and not report.requeued and not report.dead_lettered
    assert status("o0") == Status.CANCELLED
    assert reasons("o0")[-1][:3] == ("processing", "cancelled", "aborted")
    assert [x.message_id for x in service.claim(Q)] == ["o1"]  # its key goes on


def test_requeue_by_an_operator_withdraws_the_abort() -> None:
    service = worker()
    service.persist_message("q1", Q, {})
    service.claim(Q)
    zeroloss.cancel("q1", abort=True)
    assert service.requeue_messages(["q1"], force=True) == ["q1"]
    assert Message.objects.get(message_id="q1").abort_requested_at is None
    (lease,) = service.claim(Q)
    assert service.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE)]).acknowledged == ["q1"]


# -- the conservation check ----------------------------------------------------------------------


def test_verify_counts_cancelled_messages() -> None:
    service = worker()
    for mid in ("v1", "v2", "v3"):
        service.persist_message(mid, Q, {})
    zeroloss.cancel("v1")
    (lease,) = service.claim(Q)
    zeroloss.cancel(lease.message_id, abort=True)
    service.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE)])
    result = run("zeroloss_verify", "--json")
    assert result.code == 0, result.out + result.err
    assert '"unbalanced"' not in result.out and '"illegal' not in result.out
    assert Message.objects.filter(status=Status.CANCELLED).count() == 2


# -- the command ---------------------------------------------------------------------------------


def test_command_cancels_pending_exit_0() -> None:
    worker().persist_message("cmd1", Q, {})
    result = run("zeroloss_cancel", "cmd1")
    assert result.code == 0, result.err
    assert "cmd1: cancelled" in result.out
    assert status("cmd1") == Status.CANCELLED


def test_command_reports_running_without_abort_exit_1_and_aborts_with_it() -> None:
    service = worker()
    service.persist_message("cmd2", Q, {})
    service.persist_message("cmd3", Q, {})
    service.claim_message("cmd2")
    result = run("zeroloss_cancel", "cmd2", "cmd3", "--json")
    assert result.code == 1
    document = json.loads(result.out)
    assert document["results"] == [
        {"message_id": "cmd2", "outcome": "running", "status": "processing"},
        {"message_id": "cmd3", "outcome": "cancelled", "status": "cancelled"},
    ]
    assert document["ok"] is False
    assert status("cmd2") == Status.PROCESSING
    result = run("zeroloss_cancel", "cmd2", "--abort", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["results"][0]["outcome"] == "abort_requested"
    assert Message.objects.get(message_id="cmd2").abort_requested_at is not None


def test_command_finished_exit_1() -> None:
    service = worker()
    service.persist_message("cmd4", Q, {})
    (lease,) = service.claim(Q)
    service.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE)])
    result = run("zeroloss_cancel", "cmd4", "--abort")
    assert result.code == 1
    assert "cmd4: already finished (completed)" in result.out


def test_command_already_cancelled_exit_0_says_it_already_was() -> None:
    service = worker()
    service.persist_message("cmd6", Q, {})
    assert run("zeroloss_cancel", "cmd6").code == 0
    result = run("zeroloss_cancel", "cmd6")
    assert result.code == 0, result.out + result.err
    assert "cmd6: already cancelled (cancelled)" in result.out
    document = json.loads(run("zeroloss_cancel", "cmd6", "--json").out)
    assert document["ok"] is True and document["results"][0]["outcome"] == "already_cancelled"
    assert [e.reason for e in MessageEvent.objects.for_message("cmd6")].count("cancelled_by_operator") == 1
    service.persist_message("cmd7", Q, {})
    service.claim_message("cmd7")
    assert run("zeroloss_cancel", "cmd7", "--abort").code == 0
    again = run("zeroloss_cancel", "cmd7", "--abort")
    assert again.code == 0, again.out + again.err
    assert "cmd7: running: its abort was already requested" in again.out
    assert run("zeroloss_cancel", "cmd7").code == 1  # without --abort a running message is not cancelled


def test_command_unknown_or_malformed_id_exit_2_nothing_changed() -> None:
    worker().persist_message("cmd5", Q, {})
    result = run("zeroloss_cancel", "cmd5", "missing")
    assert result.code == 2
    assert "unknown message id(s): 'missing'; nothing was changed" in result.err
    result = run("zeroloss_cancel", "cmd5", "x" * 300)
    assert result.code == 2
    assert status("cmd5") == Status.PENDING
    assert not MessageEvent.objects.filter(reason="cancelled_by_operator").exists()


def test_cancelled_messages_are_purged_and_stay_counted() -> None:
    service = worker()
    for mid in ("g1", "g2"):
        service.persist_message(mid, Q, {})
    zeroloss.cancel("g1")
    backdate(["g1"], "updated_at", seconds_ago=1)  # "older than 0 s" even within the clock's millisecond
    assert service.purge_messages(status=Status.CANCELLED, older_than=0) == 1
    assert list(Message.objects.values_list("message_id", flat=True)) == ["g2"]
    result = run("zeroloss_verify", "--json")
    assert result.code == 0, result.out + result.err
    assert json.loads(result.out)["conservation"]["balanced"]
