"""The Celery transport when the broker misbehaves: refusing, hung (SIGSTOP), a lagging beat.

Before 0.2: 5 sends in one transaction to a refusing broker took 30 s (6 s of kombu retries
each); with a hung Redis, send() + commit had not returned after 75 s and `zeroloss_sweep
--loop` neither recovered an expired lease in 40 s nor stopped on SIGTERM within 10 s; with
300 deliveries queued ahead, the beat sweep was discarded 18 times ("revoked"). The bounds
asserted here are liveness bounds (a hang is the defect), generous for a loaded machine.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from django.db import transaction

import zeroloss
from tests.conftest import child_env
from tests.support import PrivateRedis, expire_leases
from tests.support.celery import use_broker
from tests.support.processes import Proc, celery_beat, celery_worker
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.once]


@pytest.fixture
def celery_transport(settings):
    from project.celery import app

    settings.ZEROLOSS = {**settings.ZEROLOSS, "TRANSPORT": "celery", "PUBLISH_TIMEOUT": 1.0}
    old = app.conf.broker_url
    yield
    use_broker(old)


@pytest.fixture
def private_redis():
    server = PrivateRedis()
    yield server
    server.stop()


def test_a_refusing_broker_costs_one_bounded_attempt_per_transaction(celery_transport, caplog):
    use_broker("redis://127.0.0.1:9/0")  # nothing listens there
    caplog.set_level(logging.WARNING, logger="zeroloss")
    started = time.monotonic()
    with transaction.atomic():
        for n in range(5):
            zeroloss.send("demo.record", {"n": n}, message_id=f"r{n}")
    elapsed = time.monotonic() - started
    assert elapsed < 8, f"send + commit took {elapsed:.1f}s with the broker refusing"
    assert Message.objects.filter(dispatched_at__isnull=True).count() == 5  # the sweep's candidates
    attempts = [r for r in caplog.records if "could not publish" in r.getMessage()]
    assert len(attempts) == 1 and "5 message(s)" in attempts[0].getMessage()


def test_a_hung_broker_never_holds_up_send_the_sweep_or_its_sigterm(celery_transport, private_redis):
    use_broker(private_redis.url)
    private_redis.freeze()  # accepts connections, never answers
    started = time.monotonic()
    with transaction.atomic():
        zeroloss.send("demo.record", {}, message_id="hung-1")
    elapsed = time.monotonic() - started
    assert elapsed < 8, f"send + commit took {elapsed:.1f}s with the broker hung"
    # An orphan whose lease expired: the sweep must requeue it whatever the broker does.
    service = ZeroLossMessageService(instance_id="dead-worker")
    service.persist_message("orphan", "demo.record", {})
    assert service.claim_message("orphan")
    expire_leases(["orphan"])
    env = child_env(CELERY_BROKER_URL=private_redis.url, ZEROLOSS_LOG_LEVEL="INFO")
    sweeper = Proc([sys.executable, "manage.py", "zeroloss_sweep", "--loop", "--interval", "0.5"], env)
    try:
        sweeper.wait_for("sweeping every", timeout=60)
        assert wait_until(
            lambda: MessageEvent.objects.filter(
                message__message_id="orphan", reason="lease_expired"
            ).exists(),
            timeout=20,
        ), sweeper.text
        stopped = time.monotonic()
        os.killpg(sweeper.popen.pid, signal.SIGTERM)
        assert sweeper.popen.wait(timeout=20) == 0, sweeper.text
        assert time.monotonic() - stopped < 8, "SIGTERM waited on the hung broker"
    finally:
        sweeper.terminate(timeout=5)
        private_redis.thaw()
    assert Message.objects.get(message_id="orphan").status == Status.PENDING
    assert "could not publish" in sweeper.text


def test_redispatch_stamps_before_publishing_so_a_message_failed_meanwhile_stays_a_candidate():
    service = ZeroLossMessageService(instance_id="w", retry_backoff={"BASE": 0, "MAX": 0})
    service.persist_message("m1", "demo.record", {})
    candidates = service.dispatch_candidates(grace=0)
    assert [c[0] for c in candidates] == ["m1"]
    service.mark_dispatched(["m1"])  # the stamp, before the publish goes out
    lease = service.claim_message("m1")  # a delivery already in the broker claims it ...
    assert lease and service.fail("m1", lease.token, "boom")  # ... and fails: it needs a new task
    assert [c[0] for c in service.dispatch_candidates(grace=0)] == ["m1"]


def test_the_beat_sweep_is_not_starved_by_deliveries_nor_defeated_by_a_skewed_clock(tmp_path: Path, settings):
    from tests.support.debian import ensure_debian_package

    ensure_debian_package("faketime", ["faketime"])
    server = PrivateRedis()
    procs: list[Proc] = []
    try:
        settings.ZEROLOSS = {**settings.ZEROLOSS, "TRANSPORT": "celery"}
        service = ZeroLossMessageService(instance_id="dead-worker")
        service.persist_message("orphan", "demo.record", {})
        assert service.claim_message("orphan")
        expire_leases(["orphan"])
        # 300 slow deliveries queued ahead of any sweep, on the same worker.
        service.persist_messages([(f"slow{i}", "demo.record", {"sleep": 0.05}) for i in range(300)])
        use_broker(server.url)
        from zeroloss.integrations.celery.transport import publish

        assert len(publish(service, [(f"slow{i}", 0.0) for i in range(300)])) == 300
        env = {"ZEROLOSS_SWEEP_INTERVAL": "0.5"}
        procs.append(celery_worker(server.url, concurrency=1, **env))
        beat = celery_beat(server.url, tmp_path, under=("faketime", "-f", "-5s"), **env)
        procs.append(beat)
        recovered = wait_until(
            lambda: MessageEvent.objects.filter(
                message__message_id="orphan", reason="lease_expired"
            ).exists(),
            timeout=30,
        )
        assert recovered, procs[0].text[-3000:] + beat.text[-2000:]
        assert Message.objects.filter(status=Status.COMPLETED, message_id__startswith="slow").count() < 300, (
            "the orphan was recovered only after the backlog drained: the sweep was starved"
        )
        assert "revoked" not in procs[0].text
    finally:
        for p in procs:
            p.terminate(timeout=15)
        server.stop()
        use_broker(os.environ.get("ZEROLOSS_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"))
