"""The proof, with real processes: a task enqueued with ``@task(...).enqueue()`` in a transaction
survives a SIGKILLed ``zeroloss_worker``: with default settings it runs again within 10 s of the
kill and finishes SUCCESSFUL on its second attempt; a rolled-back enqueue never runs."""

from __future__ import annotations

import sys
import time

import pytest
from django.db import transaction

from project.demo.models import OrderedRun
from tests.infra import task_functions as tf
from tests.support.processes import db_worker
from zeroloss.conf import ZeroLossSettings
from zeroloss.integrations.tasks_backend import compat
from zeroloss.ledger.models import Message, MessageEvent
from zeroloss.ledger.service import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

#: zeroloss's defaults (ACK_TIMEOUT 5 s, SWEEP_INTERVAL 2 s), whatever the environment says.
DEFAULTS = {
    "ZEROLOSS_ACK_TIMEOUT": str(ZeroLossSettings.ACK_TIMEOUT),
    "ZEROLOSS_SWEEP_INTERVAL": str(ZeroLossSettings.SWEEP_INTERVAL),
    "ZEROLOSS_SETTINGS_JSON": "{}",
}


class Abort(Exception):
    pass


def _rolled_back_request() -> str:
    """A request that enqueues a task and then fails: its transaction takes the task with it."""
    ids = []
    try:
        with transaction.atomic():
            ids.append(tf.slow_first_attempt.enqueue(seconds=0).id)
            raise Abort
    except Abort:
        pass
    return ids[0]


def test_a_sigkilled_workers_task_runs_again_within_10_seconds_and_succeeds():
    ghost = _rolled_back_request()
    with transaction.atomic():
        result = tf.slow_first_attempt.enqueue(seconds=120)
    assert list(Message.objects.values_list("message_id", flat=True)) == [result.id]

    first = db_worker("--queue", "default", **DEFAULTS)
    try:
        assert wait_until(lambda: OrderedRun.objects.filter(message_id=result.id).exists(), 60), first.text
        assert tf.slow_first_attempt.get_result(result.id).status == compat.TaskResultStatus.RUNNING
        killed_at = time.time()
        first.sigkill_group()  # mid-task: its first attempt sleeps 120 s
    finally:
        first.terminate()
    second = db_worker("--queue", "default", **DEFAULTS)
    try:
        assert wait_until(
            lambda: tf.slow_first_attempt.get_result(result.id).status == compat.TaskResultStatus.SUCCESSFUL,
            60,
        ), second.text
    finally:
        assert second.terminate() == 0, second.text

    runs = {r.ordering_key: r for r in OrderedRun.objects.filter(message_id=result.id)}
    assert sorted(runs) == ["attempt-1", "attempt-2"]
    rerun = runs["attempt-2"].started - killed_at
    print(f"\ntask kill -> rerun: {rerun:.2f} s", file=sys.stderr)
    assert 0 < rerun <= 10, rerun

    done = tf.slow_first_attempt.get_result(result.id)
    assert done.status == compat.TaskResultStatus.SUCCESSFUL
    assert done.attempts == 2 and done.return_value == {"attempt": 2}
    assert len(set(done.worker_ids)) == 2 and done.errors == []
    m = Message.objects.get(message_id=result.id)
    assert (m.status, m.attempts, m.result) == ("completed", 2, {"attempt": 2})
    reasons = list(MessageEvent.objects.filter(message=m).order_by("id").values_list("reason", flat=True))
    assert reasons == ["persisted", "claimed", "lease_expired", "claimed", "acknowledged"]
    # The rolled-back enqueue: never stored, never run.
    assert not Message.objects.filter(message_id=ghost).exists()
    assert not OrderedRun.objects.filter(message_id=ghost).exists()
