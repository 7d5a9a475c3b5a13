"""A handler's retry policy with real ``zeroloss_worker`` processes (issue 49): the precedence
of ``max_attempts`` (send > handler > settings), ``retry_on`` / ``dont_retry_on``, and each
outcome a handler raises (``zeroloss.Retry``, ``Snooze``, ``Fail``) under the thread pool and
the process pool, for sync, async and transactional handlers.

The handlers are in ``tests/infra/retry_app`` (installed in the workers with ``ZEROLOSS_EXTRA_APPS``);
each plays its message's script (see there). Every time is the database clock's (audit rows).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import tests.infra.retry_app.zeroloss_handlers  # noqa: F401  (the same queues in this process)
import zeroloss
from tests.support.processes import Proc, db_worker
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

#: The workers' settings: failures retried at once (RETRY_BACKOFF 0), three snoozes at most.
WORKER_SETTINGS = json.dumps({"RETRY_BACKOFF": {"BASE": 0, "MAX": 0}, "MAX_SNOOZES": 3})


def worker(*queues: str, pool: str = "thread") -> Proc:
    args = [arg for q in queues for arg in ("--queue", q)]
    return db_worker(
        *args,
        "--pool",
        pool,
        "--concurrency",
        "2",
        "--poll-interval",
        "0.1",
        ZEROLOSS_EXTRA_APPS="tests.infra.retry_app",
        ZEROLOSS_SETTINGS_JSON=WORKER_SETTINGS,
        # No lease runs out on a loaded host: an expiry's requeue would add rows to the trails.
        ZEROLOSS_ACK_TIMEOUT="60",
    )


def run_until_finished(proc: Proc, message_ids: list[str], timeout: float = 120) -> None:
    """Until each message is completed or dead (a Retry's delay may outlast a --burst worker)."""
    try:

        def finished() -> bool:
            done = Message.objects.filter(
                message_id__in=message_ids, status__in=[Status.COMPLETED, Status.DEAD]
            )
            return done.count() == len(message_ids)

        assert wait_until(finished, timeout), proc.text
    finally:
        proc.terminate()


def trail(message_id: str) -> list[str]:
    return list(
        MessageEvent.objects.filter(message__message_id=message_id)
        .order_by("id")
        .values_list("reason", flat=True)
    )


def script(*steps: str, delay: float = 0) -> dict[str, Any]:
    return {"script": list(steps), "delay": delay}


def test_max_attempts_send_over_handler_over_settings_with_real_workers(settings: Any) -> None:
    settings.ZEROLOSS = {**settings.ZEROLOSS, "MAX_ATTEMPTS": 4}  # this (sending) process's setting
    zeroloss.send("rp.policy", script("error"), message_id="by-handler")  # max_attempts=3
    zeroloss.send("rp.policy", script("error"), message_id="by-send", max_attempts=2)
    zeroloss.send("rp.plain", script("error"), message_id="by-settings")
    zeroloss.send("rp.only", script("key"), message_id="dont-retry")  # dont_retry_on=(KeyError,)
    zeroloss.send("rp.only", script("error"), message_id="not-in-retry-on")  # retry_on=(ConnectionError,)
    zeroloss.send("rp.only", script("conn", "ok"), message_id="in-retry-on")
    ids = ["by-handler", "by-send", "by-settings", "dont-retry", "not-in-retry-on", "in-retry-on"]
    run_until_finished(worker("rp.policy", "rp.plain", "rp.only"), ids)
    rows = {m.message_id: (m.status, m.attempts, m.max_attempts) for m in Message.objects.all()}
    assert rows == {
        "by-handler": (Status.DEAD, 3, 3),
        "by-send": (Status.DEAD, 2, 2),
        "by-settings": (Status.DEAD, 4, 4),
        "dont-retry": (Status.DEAD, 1, 4),
        "not-in-retry-on": (Status.DEAD, 1, 4),
        "in-retry-on": (Status.COMPLETED, 2, 4),
    }
    assert trail("by-handler").count("claimed") == 3 and trail("by-handler")[-1] == "dead_lettered"
    assert trail("dont-retry") == ["persisted", "claimed", "dead_lettered_by_handler"]
    assert Message.objects.get(message_id="dont-retry").last_error.startswith(
        "KeyError: 'missing'\n(not retried: dont_retry_on of its handler)\n"
    )
    assert Message.objects.get(message_id="not-in-retry-on").last_error.startswith(
        "ValueError: boom\n(not retried: retry_on of its handler)\n"
    )


@pytest.mark.parametrize(
    ("pool", "queue"),
    [
        ("thread", "rp.script"),
        ("thread", "rp.script_async"),
        ("thread", "rp.script_tx"),
        ("process", "rp.script"),
        ("process", "rp.script_async"),
    ],
)
def test_each_raised_outcome_with_real_workers(pool: str, queue: str) -> None:
    zeroloss.send(queue, script("snooze", "snooze", "ok"), message_id="snoozer")
    zeroloss.send(queue, script("retry", "ok", delay=1.5), message_id="retrier")
    zeroloss.send(queue, script("fail"), message_id="failer", max_attempts=5)
    zeroloss.send(queue, script("snooze"), message_id="sleeper", max_attempts=2)  # for ever, if it could
    # A batch of the same outcomes, recorded together.
    zeroloss.send_many(queue, [script("snooze", "retry", "ok")] * 6, message_ids=[f"b{i}" for i in range(6)])
    ids = ["snoozer", "retrier", "failer", "sleeper", *(f"b{i}" for i in range(6))]
    run_until_finished(worker(queue, pool=pool), ids)

    # Snooze: not a failure, not an attempt.
    snoozer = Message.objects.get(message_id="snoozer")
    assert (snoozer.status, snoozer.attempts, snoozer.last_error) == (Status.COMPLETED, 1, "")
    assert trail("snoozer") == [
        "persisted",
        *["claimed", "snoozed"] * 2,
        "claimed",
        "acknowledged",
    ]
    snoozed = MessageEvent.objects.filter(message__message_id="snoozer", reason="snoozed").first()
    assert snoozed is not None and snoozed.detail == "zeroloss.Snooze: for 0 s: not ready"

    # Retry: a failed attempt, run again no sooner than its delay (the database clock's).
    assert trail("retrier") == ["persisted", "claimed", "failed", "claimed", "acknowledged"]
    failed = MessageEvent.objects.get(message__message_id="retrier", reason="failed")
    again = MessageEvent.objects.filter(message__message_id="retrier", reason="claimed").order_by("id").last()
    assert again is not None and (again.created_at - failed.created_at).total_seconds() >= 1.5
    assert failed.detail.startswith("zeroloss.Retry: after 1.5 s: rate limited")
    assert Message.objects.get(message_id="retrier").attempts == 2

    # Fail: dead now, four attempts left.
    failer = Message.objects.get(message_id="failer")
    assert (failer.status, failer.attempts) == (Status.DEAD, 1)
    assert trail("failer") == ["persisted", "claimed", "dead_lettered_by_handler"]
    assert failer.last_error.startswith("zeroloss.Fail: gone\n")

    # Snoozing for ever is bounded: MAX_SNOOZES (3) snoozes, then each counts as a failed attempt.
    sleeper = Message.objects.get(message_id="sleeper")
    assert (sleeper.status, sleeper.attempts) == (Status.DEAD, 2)
    assert trail("sleeper") == [
        "persisted",
        *["claimed", "snoozed"] * 3,
        "claimed",
        "failed",
        "claimed",
        "dead_lettered",
    ]
    assert "MAX_SNOOZES is 3: counted as a failed attempt" in sleeper.last_error

    for i in range(6):
        assert trail(f"b{i}") == [
            "persisted",
            "claimed",
            "snoozed",
            "claimed",
            "failed",
            "claimed",
            "acknowledged",
        ]
