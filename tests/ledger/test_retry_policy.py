"""A handler's retry policy (issue 49): ``max_attempts``, ``backoff``, ``retry_on`` and
``dont_retry_on`` on ``@zeroloss.handler``, and what a handler raises: ``zeroloss.Retry``,
``zeroloss.Snooze`` (bounded by ``MAX_SNOOZES``), ``zeroloss.Fail``.

Here on the ledger (the handlers run in this process, by ``zeroloss.testing.drain`` or by hand);
tests/process/test_retry_policy_processes.py runs the same handlers in real worker processes.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.urls import reverse

import tests.infra.retry_app.zeroloss_handlers  # the rp.* queues
import zeroloss
from tests.support import expire_leases
from tests.support.admin import client_for, make_user
from tests.support.factories import ledger_state
from zeroloss.core.states import TRANSITIONS, Reason
from zeroloss.exceptions import InvalidHandler
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ledger.types import Completion, Verdict
from zeroloss.runtime import handlers
from zeroloss.runtime.handlers import get_handler
from zeroloss.runtime.processing import Delivery, judge, run_handler
from zeroloss.runtime.retry import seconds_of
from zeroloss.testing import drain

DB = pytest.mark.django_db(transaction=True)


def reasons(message_id: str) -> list[str]:
    return list(
        MessageEvent.objects.filter(message__message_id=message_id)
        .order_by("id")
        .values_list("reason", flat=True)
    )


def script(*steps: str, delay: float = 0) -> dict[str, Any]:
    return {"script": list(steps), "delay": delay}


# -- the public names and the policy's values (no database) ---------------------------------------


def test_the_public_names_are_exported_from_zeroloss() -> None:
    for name in ("Retry", "Snooze", "Fail", "ExponentialBackoff", "FixedBackoff", "Backoff"):
        assert name in zeroloss.__all__
        assert getattr(zeroloss, name) is not None
    assert issubclass(zeroloss.Retry, Exception) and issubclass(zeroloss.Fail, Exception)
    assert zeroloss.Retry.__module__ == "zeroloss"  # recorded as zeroloss.Retry


def test_built_in_backoffs() -> None:
    fixed = zeroloss.FixedBackoff(30)
    assert [fixed(n) for n in (1, 2, 9)] == [30.0, 30.0, 30.0]
    exact = zeroloss.ExponentialBackoff(base=2, cap=60, jitter=False)
    assert [exact(n) for n in (1, 2, 3, 4, 5, 6, 100_000)] == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    jittered = zeroloss.ExponentialBackoff(base=2, cap=60)
    draws = [jittered(4) for _ in range(200)]
    assert all(0.0 <= d <= 16.0 for d in draws) and len(set(draws)) > 100  # full jitter: 0..bound


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: zeroloss.ExponentialBackoff(base=-1), "base must be from 0"),
        (lambda: zeroloss.ExponentialBackoff(base=10, cap=5), "cap (5) must be >= its base (10)"),
        (lambda: zeroloss.FixedBackoff(float("nan")), "delay must be a number of seconds"),
        (lambda: zeroloss.Retry(delay=-1), "Retry's delay must be from 0"),
        (lambda: zeroloss.Snooze(delay="soon"), "Snooze's delay must be a number of seconds"),  # type: ignore[arg-type]
    ],
)
def test_bad_delays_are_refused_saying_what_to_fix(make: Any, says: str) -> None:
    with pytest.raises(ValueError) as caught:
        make()
    assert says in str(caught.value)


def test_delays_take_timedeltas() -> None:
    assert zeroloss.Retry(delay=dt.timedelta(minutes=2)).delay == 120.0
    assert seconds_of(dt.timedelta(milliseconds=1500), "x") == 1.5


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"max_attempts": 0}, "max_attempts must be an integer from 1 to 1000000"),
        ({"max_attempts": True}, "max_attempts must be an integer"),
        ({"backoff": 5}, "backoff must be a callable"),
        ({"retry_on": ValueError}, "retry_on must be a tuple of exception classes"),
        ({"dont_retry_on": ("KeyError",)}, "dont_retry_on must be a tuple of exception classes"),
    ],
)
def test_a_policy_it_cannot_honour_is_refused_at_registration(options: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidHandler) as caught:

        @zeroloss.handler("rp.refused", **options)
        def refused(delivery: Any) -> None: ...

    assert says in str(caught.value)
    assert "rp.refused" not in handlers._registry


def _judged(queue: str, exc: BaseException, attempt: int = 1) -> tuple[Verdict, float | None, str]:
    return judge(get_handler(queue), attempt, exc)


def test_what_each_raised_outcome_asks_for() -> None:
    verdict, delay, error = _judged("rp.script", zeroloss.Retry(delay=30, reason="rate limited"))
    assert (verdict, delay) == (Verdict.FAIL, 30.0)
    assert error.startswith("zeroloss.Retry: after 30 s: rate limited\n")
    verdict, delay, error = _judged("rp.script", zeroloss.Snooze(delay=5, reason="not ready"))
    assert (verdict, delay) == (Verdict.SNOOZE, 5.0) and error.startswith(
        "zeroloss.Snooze: for 5 s: not ready"
    )
    verdict, delay, error = _judged("rp.script", zeroloss.Fail("gone"))
    assert (verdict, delay) == (Verdict.FAIL_FINAL, None) and error.startswith("zeroloss.Fail: gone")
    # Any other error: the handler's backoff, else RETRY_BACKOFF (None).
    assert _judged("rp.script", ValueError("x"))[:2] == (Verdict.FAIL, None)
    assert _judged("rp.slow_backoff", ValueError("x"))[:2] == (Verdict.FAIL, 7.0)


def test_retry_on_and_dont_retry_on() -> None:
    verdict, _, error = _judged("rp.only", KeyError("k"))
    assert verdict == Verdict.FAIL_FINAL
    assert error.startswith("KeyError: 'k'\n(not retried: dont_retry_on of its handler)\n")
    verdict, _, error = _judged("rp.only", ValueError("v"))
    assert verdict == Verdict.FAIL_FINAL
    assert error.startswith("ValueError: v\n(not retried: retry_on of its handler)\n")
    assert _judged("rp.only", ConnectionRefusedError("c"))[:2] == (Verdict.FAIL, 0.0)  # a subclass: retried
    # zeroloss.Retry, Snooze and Fail choose their own outcome, whatever retry_on says.
    assert _judged("rp.only", zeroloss.Snooze(delay=1))[0] == Verdict.SNOOZE


def test_a_broken_backoff_falls_back_to_the_settings_and_says_so() -> None:
    spec = handlers.HandlerSpec("rp.broken", lambda d: None, backoff=lambda attempt: -5)
    verdict, delay, error = judge(spec, 1, ValueError("x"))
    assert (verdict, delay) == (Verdict.FAIL, None)
    assert "(its backoff failed, RETRY_BACKOFF used instead: the handler's backoff must be from 0" in error


def test_the_new_edges_are_in_the_one_table() -> None:
    edges = {(t.source, t.target, t.reason, t.actor) for t in TRANSITIONS}
    assert ("processing", "pending", Reason.SNOOZED, "worker") in edges
    assert ("processing", "dead", Reason.DEAD_LETTERED_BY_HANDLER, "worker") in edges


# -- precedence: send > handler > settings ------------------------------------------------------


@DB
def test_max_attempts_send_over_handler_over_settings(settings: Any) -> None:
    settings.ZEROLOSS = {**settings.ZEROLOSS, "MAX_ATTEMPTS": 4}
    zeroloss.send("rp.policy", script("error"), message_id="handler")
    zeroloss.send("rp.policy", script("error"), message_id="sent", max_attempts=2)
    zeroloss.send("rp.plain", script("error"), message_id="settings")
    zeroloss.send_many("rp.policy", [script("error")], message_ids=["many"])
    stored = dict(Message.objects.values_list("message_id", "max_attempts"))
    assert stored == {"handler": 3, "sent": 2, "settings": 4, "many": 3}


# -- the outcomes on the ledger: each fenced, audited, as the one table says ----------------------


def _claimed(
    service: ZeroLossMessageService, message_id: str, queue: str = "rp.script", **options: Any
) -> Any:
    service.persist_message(message_id, queue, script("ok"), **options)
    lease = service.claim_message(message_id)
    assert lease
    return lease


def _db_seconds(later: dt.datetime | None, earlier: dt.datetime | None) -> float:
    assert later is not None and earlier is not None
    return (later - earlier).total_seconds()


@DB
def test_retry_fails_the_attempt_and_runs_again_after_exactly_its_delay() -> None:
    service = ZeroLossMessageService()
    lease = _claimed(service, "r1")
    report = service.record_outcomes(
        [Completion(lease, Verdict.FAIL, "zeroloss.Retry: after 30 s", delay=30)]
    )
    assert report.retrying == ["r1"]
    m = Message.objects.get(message_id="r1")
    assert (m.status, m.attempts) == (Status.PENDING, 1)
    assert _db_seconds(m.available_at, m.updated_at) == pytest.approx(30, abs=0.001)
    event = MessageEvent.objects.filter(message=m).order_by("id").last()
    assert event is not None and (event.reason, event.detail) == ("failed", "zeroloss.Retry: after 30 s")


@DB
def test_snooze_does_not_count_the_attempt_and_keeps_the_last_error() -> None:
    service = ZeroLossMessageService()
    lease = _claimed(service, "s1")
    assert service.fail("s1", lease.token, "an earlier error")
    Message.objects.filter(message_id="s1").update(
        available_at=Message.objects.get(message_id="s1").created_at
    )
    lease = service.claim_message("s1")
    assert lease and lease.attempt == 2
    error = "zeroloss.Snooze: for 5 s: not ready\nTraceback ..."
    report = service.record_outcomes([Completion(lease, Verdict.SNOOZE, error, delay=5)])
    assert report.snoozed == ["s1"] and report.retrying == []
    m = Message.objects.get(message_id="s1")
    assert (m.status, m.attempts, m.last_error) == (Status.PENDING, 1, "an earlier error")
    assert _db_seconds(m.available_at, m.updated_at) == pytest.approx(5, abs=0.001)
    event = MessageEvent.objects.filter(message=m).order_by("id").last()
    assert event is not None
    assert (event.from_status, event.to_status, event.reason) == ("processing", "pending", "snoozed")
    assert event.detail == "zeroloss.Snooze: for 5 s: not ready"  # the first line


@DB
def test_fail_dead_letters_now_with_attempts_left() -> None:
    service = ZeroLossMessageService()
    lease = _claimed(service, "f1", max_attempts=10)
    report = service.record_outcomes([Completion(lease, Verdict.FAIL_FINAL, "zeroloss.Fail: gone")])
    assert report.dead_lettered == ["f1"]
    m = Message.objects.get(message_id="f1")
    assert (m.status, m.attempts, m.max_attempts, m.last_error) == (Status.DEAD, 1, 10, "zeroloss.Fail: gone")
    assert m.dead_at is not None
    assert reasons("f1")[-1] == "dead_lettered_by_handler"


@DB
def test_snoozes_are_bounded_by_max_snoozes_then_count_as_failed_attempts(settings: Any) -> None:
    settings.ZEROLOSS = {**settings.ZEROLOSS, "MAX_SNOOZES": 2}
    service = ZeroLossMessageService()
    service.persist_message("b1", "rp.script", script("snooze"), max_attempts=2)
    seen = drain("rp.script")
    assert [a.outcome for a in seen] == ["snoozed", "snoozed", "failed", "dead"]
    m = Message.objects.get(message_id="b1")
    assert (m.status, m.attempts) == (Status.DEAD, 2)
    assert "snoozed 2 times already, MAX_SNOOZES is 2: counted as a failed attempt" in m.last_error
    assert reasons("b1").count("snoozed") == 2


@DB
def test_a_batch_of_every_outcome_is_recorded_in_one_transaction() -> None:
    service = ZeroLossMessageService()
    leases = {m: _claimed(service, m) for m in ("a", "b", "c", "d", "e")}
    report = service.record_outcomes(
        [
            Completion(leases["a"], Verdict.ACKNOWLEDGE),
            Completion(leases["b"], Verdict.FAIL, "x", delay=60),
            Completion(leases["c"], Verdict.SNOOZE, "zeroloss.Snooze: for 60 s", delay=60),
            Completion(leases["d"], Verdict.SNOOZE, "zeroloss.Snooze: for 60 s: other", delay=60),
            Completion(leases["e"], Verdict.FAIL_FINAL, "zeroloss.Fail: gone"),
        ]
    )
    assert (report.acknowledged, report.retrying, sorted(report.snoozed), report.dead_lettered) == (
        ["a"],
        ["b"],
        ["c", "d"],
        ["e"],
    )
    assert dict(Message.objects.values_list("message_id", "status")) == {
        "a": "completed",
        "b": "pending",
        "c": "pending",
        "d": "pending",
        "e": "dead",
    }


@DB
@pytest.mark.parametrize("verdict", [Verdict.FAIL, Verdict.SNOOZE, Verdict.FAIL_FINAL])
def test_a_stale_lease_token_changes_nothing(verdict: Verdict) -> None:
    """Expired, then swept and claimed again: the first lease's Retry/Snooze/Fail is refused."""
    service = ZeroLossMessageService()
    stale = _claimed(service, "x1")
    expire_leases(["x1"])
    expired = ledger_state()
    report = service.record_outcomes([Completion(stale, verdict, "zeroloss.Retry: after 5 s", delay=5)])
    assert report.refused == ["x1"] and ledger_state() == expired  # an expired lease
    assert service.sweep().requeued == ["x1"]
    Message.objects.filter(message_id="x1").update(
        available_at=Message.objects.get(message_id="x1").created_at
    )
    current = service.claim_message("x1")
    assert current and current.token != stale.token
    before = ledger_state()
    report = service.record_outcomes([Completion(stale, verdict, "zeroloss.Retry: after 5 s", delay=5)])
    assert report.refused == ["x1"] and ledger_state() == before  # a lease token since replaced
    assert service.acknowledge("x1", current.token)  # the current holder's outcome stands


# -- handlers run here (drain): sync, async, transactional -----------------------------------------


@DB
@pytest.mark.parametrize("queue", ["rp.script", "rp.script_async", "rp.script_tx"])
def test_each_raised_outcome_through_a_handler(queue: str) -> None:
    zeroloss.send(queue, script("snooze", "retry", "ok"), message_id="seq")
    zeroloss.send(queue, script("fail"), message_id="gone", max_attempts=5)
    seen = drain(queue)
    assert sorted((a.message_id, a.outcome) for a in seen) == [
        ("gone", "dead"),
        ("seq", "completed"),
        ("seq", "failed"),
        ("seq", "snoozed"),
    ]
    assert reasons("seq") == [
        "persisted",
        "claimed",
        "snoozed",
        "claimed",
        "failed",
        "claimed",
        "acknowledged",
    ]
    assert Message.objects.get(message_id="seq").attempts == 2  # the snoozed run not counted
    assert reasons("gone") == ["persisted", "claimed", "dead_lettered_by_handler"]
    gone = Message.objects.get(message_id="gone")
    assert (gone.status, gone.attempts) == (Status.DEAD, 1)
    assert gone.last_error.startswith("zeroloss.Fail: gone\n")


@DB
def test_a_transactional_handlers_writes_are_rolled_back_by_each_raised_outcome() -> None:
    from project.demo.models import HandledRecord

    @zeroloss.handler("rp.tx_writes", transactional=True)
    def writes(delivery: Delivery) -> None:
        HandledRecord.objects.create(message_id=delivery.message_id, queue_name="rp.tx_writes", worker="w")
        tests.infra.retry_app.zeroloss_handlers.step(delivery)

    try:
        for mid, steps in {
            "t-snooze": ("snooze", "ok"),
            "t-retry": ("retry", "ok"),
            "t-fail": ("fail",),
        }.items():
            zeroloss.send("rp.tx_writes", script(*steps), message_id=mid)
        drain("rp.tx_writes")
        # One write each for the run that returned; none for a run that raised.
        assert sorted(HandledRecord.objects.values_list("message_id", flat=True)) == ["t-retry", "t-snooze"]
    finally:
        handlers._registry.pop("rp.tx_writes", None)


@DB
def test_run_handler_carries_the_verdict_and_delay() -> None:
    lease = _claimed(ZeroLossMessageService(), "v1")

    def snoozes(delivery: Any) -> None:
        raise zeroloss.Snooze(delay=3)

    run = run_handler(handlers.HandlerSpec("rp.script", snoozes), Delivery(lease))
    assert (run.ok, run.verdict, run.delay) == (False, Verdict.SNOOZE, 3.0)
    completion = run.completion(lease)
    assert (completion.verdict, completion.delay) == (Verdict.SNOOZE, 3.0)


# -- the admin: the policy, and why it is where it is ----------------------------------------------


@DB
def test_the_admin_shows_the_policy_and_why_the_message_is_where_it_is() -> None:
    service = ZeroLossMessageService()
    zeroloss.send("rp.policy", script("snooze", "snooze", "retry"), message_id="w1")
    lease = service.claim_message("w1")
    assert lease
    for _ in range(2):
        assert service.record_outcomes(
            [Completion(lease, Verdict.SNOOZE, "zeroloss.Snooze: for 0 s", delay=0)]
        ).snoozed
        lease = service.claim_message("w1")
        assert lease
    error = "zeroloss.Retry: after 30 s: rate limited\nTraceback (most recent call last): ..."
    assert service.record_outcomes([Completion(lease, Verdict.FAIL, error, delay=30)]).retrying == ["w1"]
    m = Message.objects.get(message_id="w1")
    assert m.available_at is not None
    at = m.available_at.astimezone(dt.UTC).strftime("%H:%M:%S UTC")
    client = client_for(make_user("root", superuser=True))
    html = client.get(reverse("admin:zeroloss_message_change", args=[m.pk])).content.decode()
    assert f"retry 2 of 3 at {at} (in " in html
    assert "zeroloss.Retry: after 30 s: rate limited · snoozed 2 times" in html
    assert "at most 3 attempts · backoff FixedBackoff(delay=0) (its handler&#x27;s)" in html
    assert "at most 100 snoozes (MAX_SNOOZES)" in html

    lease = _claimed(service, "w2", queue="rp.only")
    service.record_outcomes([Completion(lease, Verdict.FAIL_FINAL, "zeroloss.Fail: gone")])
    page = client.get(
        reverse("admin:zeroloss_message_change", args=[Message.objects.get(message_id="w2").pk])
    )
    text = page.content.decode()
    assert "dead-lettered by its handler at attempt 1 of 5, not retried: zeroloss.Fail: gone" in text
    assert "retried only on ConnectionError · never retried on KeyError" in text


# -- Django's task backend: a task raises them as a handler does -------------------------------------


@DB
def test_a_task_may_raise_retry_snooze_and_fail() -> None:
    import threading

    from tests.infra import task_functions as tf
    from zeroloss.integrations.tasks_backend import compat
    from zeroloss.runtime.worker import Worker

    results = {kind: tf.raises_outcome.enqueue(kind) for kind in ("retry", "snooze", "fail")}
    worker = Worker(["default"], poll_interval=0.05, max_messages=3)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the worker did not finish in 60 s"
    retried = tf.raises_outcome.get_result(results["retry"].id)
    assert retried.status == compat.TaskResultStatus.READY and retried.attempts == 1
    assert [e.exception_class_path for e in retried.errors] == ["zeroloss.Retry"]
    snoozed = tf.raises_outcome.get_result(results["snooze"].id)
    assert (snoozed.status, snoozed.attempts, snoozed.errors) == (compat.TaskResultStatus.READY, 0, [])
    failed = tf.raises_outcome.get_result(results["fail"].id)
    assert failed.status == compat.TaskResultStatus.FAILED and failed.attempts == 1
    assert [e.exception_class_path for e in failed.errors] == ["zeroloss.Fail"]
    assert "zeroloss.Fail: cannot be done" in failed.errors[0].traceback


# -- the Celery transport's delivery path, and the log -------------------------------------------------


@DB
@pytest.mark.parametrize("queue", ["rp.script", "rp.script_tx"])
def test_the_celery_delivery_path_records_each_raised_outcome(queue: str) -> None:
    from zeroloss.ledger.service import wait_until
    from zeroloss.runtime.worker.transport_runtime import DeliveryRuntime, deliver

    zeroloss.send(queue, script("snooze"), message_id="c-snooze")
    zeroloss.send(queue, script("retry", delay=60), message_id="c-retry")
    zeroloss.send(queue, script("fail"), message_id="c-fail")
    try:
        for mid in ("c-snooze", "c-retry", "c-fail"):
            deliver(mid)  # what the Celery task calls
        # Outcomes are batched by the delivery runtime: wait until each is recorded.
        assert wait_until(lambda: not Message.objects.filter(status=Status.PROCESSING).exists(), 30)
    finally:
        DeliveryRuntime.close_all()
    assert reasons("c-snooze")[-1] == "snoozed" and Message.objects.get(message_id="c-snooze").attempts == 0
    retried = Message.objects.get(message_id="c-retry")
    assert reasons("c-retry")[-1] == "failed" and _db_seconds(
        retried.available_at, retried.updated_at
    ) == pytest.approx(60, abs=0.001)
    assert reasons("c-fail")[-1] == "dead_lettered_by_handler"


@DB
def test_a_snooze_is_logged_at_info_a_fail_as_a_dead_letter(caplog: Any) -> None:
    zeroloss.send("rp.script", script("snooze", delay=60), message_id="l-snooze")
    zeroloss.send("rp.script", script("fail"), message_id="l-fail")
    with caplog.at_level("INFO", logger="zeroloss"):
        drain("rp.script")
    lines = [(r.levelname, r.getMessage().partition("\n")[0]) for r in caplog.records if r.name == "zeroloss"]
    assert (
        "INFO",
        "l-snooze: handler tests.infra.retry_app.zeroloss_handlers.script snoozed (attempt 1 not counted): "
        "zeroloss.Snooze: for 60 s: not ready",
    ) in lines
    assert ("ERROR", "l-fail: dead-lettered after attempt 1 of 5: zeroloss.Fail: gone") in lines
