"""Signals (issue 25, point 3): when each fires, with what, and that a receiver which raises
never breaks a send, a worker or a sweep; with no receiver the hot path builds nothing."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection, transaction
from django.dispatch import Signal

import zeroloss
from tests.support import expire_leases, register, run_worker
from zeroloss import signals
from zeroloss.ledger.models import Message, Status
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ledger.types import Completion, Verdict
from zeroloss.runtime.processing import Delivery

pytestmark = pytest.mark.django_db(transaction=True)


class Heard:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def of(self, name: str) -> list[dict[str, Any]]:
        return [kwargs for signal, kwargs in self.calls if signal == name]


@pytest.fixture
def heard() -> Iterator[Heard]:
    got = Heard()
    connected: list[tuple[Signal, Any]] = []
    for name in signals.__all__:
        signal = getattr(signals, name)

        def receiver(sender: Any, signal: Signal, _name: str = name, **kwargs: Any) -> None:
            assert sender is ZeroLossMessageService
            got.calls.append((_name, kwargs))

        signal.connect(receiver, weak=False)
        connected.append((signal, receiver))
    yield got
    for signal, receiver in connected:
        signal.disconnect(receiver)


def noop(delivery: Delivery) -> None:
    pass


def test_message_sent_fires_after_commit_and_never_for_a_rollback(heard):
    register("s.sent", noop)
    with transaction.atomic():
        zeroloss.send("s.sent", {}, message_id="kept")
        zeroloss.send_many("s.sent", [{}, {}], message_ids=["m1", "m2"])
        assert heard.of("message_sent") == []  # not before the commit
    assert [k["message_id"] for k in heard.of("message_sent")] == ["kept", "m1", "m2"]
    assert heard.of("message_sent")[0] == {"message_id": "kept", "queue_name": "s.sent", "using": "default"}
    with transaction.atomic():
        zeroloss.send("s.sent", {}, message_id="rolled-back")
        transaction.set_rollback(True)
    assert "rolled-back" not in [k["message_id"] for k in heard.of("message_sent")]


def test_started_and_finished_with_each_outcome_and_dead_lettered(heard):
    def handle(delivery: Delivery) -> None:
        if delivery.payload.get("fail"):
            raise ValueError("no")

    register("s.run", handle)
    service = ZeroLossMessageService()
    service.persist_message("ok", "s.run", {})
    service.persist_message("retry", "s.run", {"fail": True}, max_attempts=3)
    service.persist_message("dead", "s.run", {"fail": True}, max_attempts=1)
    worker, thread = run_worker("s.run", burst=False)
    from zeroloss.ledger.service import wait_until

    assert wait_until(lambda: len(heard.of("message_finished")) >= 3, 60)
    worker.stop.set("test")
    thread.join(60)
    started = {k["delivery"].message_id for k in heard.of("message_started")}
    assert started >= {"ok", "retry", "dead"}
    outcomes = {k["message_id"]: k["outcome"] for k in heard.of("message_finished")}
    assert outcomes == {"ok": "completed", "retry": "failed", "dead": "dead"}
    finished_dead = next(k for k in heard.of("message_finished") if k["message_id"] == "dead")
    assert finished_dead["error"].startswith("ValueError: no") and finished_dead["attempt"] == 1
    assert finished_dead["worker"].endswith("/t0") and finished_dead["queue_name"] == "s.run"
    [dead] = heard.of("message_dead_lettered")
    assert dead["message_id"] == "dead" and dead["by"] == "worker" and dead["error"].startswith("ValueError")


def test_the_sweep_signals_recovered_and_dead_lettered(heard):
    service = ZeroLossMessageService(instance_id="holder")
    service.persist_message("r1", "s.sweep", {})
    service.persist_message("r2", "s.sweep", {}, max_attempts=1)
    service.claim("s.sweep", limit=2)
    expire_leases()
    ZeroLossMessageService().sweep()
    assert heard.of("message_recovered") == [
        {"message_id": "r1", "queue_name": "s.sweep", "attempt": 1, "worker": "holder", "using": "default"}
    ]
    [dead] = heard.of("message_dead_lettered")
    assert (dead["message_id"], dead["by"], dead["worker"]) == ("r2", "sweep", "holder")


def test_a_receiver_that_raises_breaks_neither_the_send_nor_the_worker(caplog):
    def rude(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    for name in ("message_sent", "message_started", "message_finished"):
        getattr(signals, name).connect(rude, weak=False)
    try:
        register("s.rude", noop)
        caplog.set_level(logging.ERROR, logger="zeroloss")
        zeroloss.send("s.rude", {}, message_id="x1")
        worker, thread = run_worker("s.rude", burst=True)
        thread.join(60)
    finally:
        for name in ("message_sent", "message_started", "message_finished"):
            getattr(signals, name).disconnect(rude)
    assert not worker.stats.crashed
    assert Message.objects.get(message_id="x1").status == Status.COMPLETED
    logged = [r for r in caplog.records if r.name == "zeroloss" and "receiver" in r.getMessage()]
    assert len(logged) == 3 and all(r.exc_info and r.exc_info[0] is RuntimeError for r in logged)


def test_with_no_receiver_an_outcome_batch_registers_nothing_after_commit(settings):
    # (With TELEMETRY on and prometheus_client installed, the counters are a listener.)
    settings.ZEROLOSS = {**settings.ZEROLOSS, "TELEMETRY": False}
    assert not any(getattr(signals, name).receivers for name in signals.__all__)
    service = ZeroLossMessageService()
    service.persist_messages([("n1", "s.cheap", {}), ("n2", "s.cheap", {})])
    leases = service.claim("s.cheap", limit=2)
    with transaction.atomic():
        report = service.record_outcomes(Completion(lease, Verdict.ACKNOWLEDGE) for lease in leases)
        assert connection.run_on_commit == []  # no callback, no arguments built
    assert sorted(report.acknowledged) == ["n1", "n2"]
