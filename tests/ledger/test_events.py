"""The ledger's event stream (zeroloss.ledger.events), the one road out for an outcome's side
effects: its events reach every subscriber after the commit, never for a rollback, in order, and
a batch nobody listens to registers nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from django.db import connection, transaction

from tests.support import expire_leases
from zeroloss.ledger import events
from zeroloss.ledger.events import (
    Cancelled,
    Claimed,
    DeadLettered,
    Event,
    Finished,
    MessageEvent,
    Recovered,
    Released,
)
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ledger.types import Completion, Verdict

pytestmark = pytest.mark.django_db(transaction=True)


class Recorder:
    """A subscriber that wants every kind and keeps what it is told, batch by batch."""

    def __init__(self) -> None:
        self.batches: list[tuple[type | None, list[Event]]] = []

    def wants(self, kind: type) -> bool:
        return True

    def __call__(self, sender: type | None, found: Sequence[Event]) -> None:
        self.batches.append((sender, list(found)))

    def of(self, kind: type) -> list[Any]:
        return [e for _, batch in self.batches for e in batch if isinstance(e, kind)]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    installed = list(events._subscribers)
    got = Recorder()
    events.subscribe(*installed, got)
    yield got
    events.subscribe(*installed)


def test_the_app_subscribes_logs_signals_telemetry_and_waiters_in_that_order():
    names = [type(s).__name__ for s in events._subscribers]
    assert names == ["LogNotices", "SignalNotices", "TelemetryEvents", "OutcomeWaiters"]


def test_outcomes_are_told_after_the_commit_in_the_batchs_order_never_for_a_rollback(recorder):
    service = ZeroLossMessageService(instance_id="w1")
    service.persist_message("ok", "e.out", {})
    service.persist_message("dead", "e.out", {}, max_attempts=1)
    service.persist_message("back", "e.out", {})
    by_id = {lease.message_id: lease for lease in service.claim("e.out", limit=3)}
    batch = [
        Completion(by_id["dead"], Verdict.FAIL, error="boom\ntraceback"),
        Completion(by_id["ok"], Verdict.ACKNOWLEDGE),
        Completion(by_id["back"], Verdict.RELEASE),
    ]
    recorder.batches.clear()  # the claim's
    with transaction.atomic():
        service.record_outcomes(batch)
        transaction.set_rollback(True)
    assert recorder.batches == []  # rolled back: nothing told
    with transaction.atomic():
        service.record_outcomes(batch)
        assert recorder.batches == []  # not before the commit
    [(sender, told)] = recorder.batches
    assert sender is ZeroLossMessageService
    assert told == [
        DeadLettered("dead", "e.out", 1, "w1", "default", "boom\ntraceback", "worker", 1, {}),
        Finished("dead", "e.out", 1, "w1", "default", "dead", "boom\ntraceback"),
        Finished("ok", "e.out", 1, "w1", "default", "completed", ""),
        Released("back", "e.out"),
    ]


def test_a_refused_outcome_is_told_as_lease_lost(recorder):
    service = ZeroLossMessageService(instance_id="w1")
    service.persist_message("late", "e.late", {})
    [lease] = service.claim("e.late")
    expire_leases()
    ZeroLossMessageService().sweep()
    recorder.batches.clear()
    service.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE)])
    assert recorder.of(Finished) == [Finished("late", "e.late", 1, "w1", "default", "lease_lost", "")]


def test_the_sweep_tells_what_it_put_back_and_dead_lettered(recorder):
    holder = ZeroLossMessageService(instance_id="holder")
    holder.persist_messages([("r1", "e.sweep", {})])
    holder.persist_message("r2", "e.sweep", {}, max_attempts=1)
    assert len(holder.claim("e.sweep", limit=2)) == 2
    expire_leases()
    recorder.batches.clear()
    ZeroLossMessageService().sweep()
    told = {e.message_id: e for e in recorder.of(MessageEvent)}
    assert told == {
        "r1": Recovered("r1", "e.sweep", 1, "holder", "default"),
        "r2": DeadLettered("r2", "e.sweep", 1, "holder", "default", "lease held by holder expired", "sweep"),
    }


def test_claims_and_an_operators_cancels_are_told_after_their_commit(recorder):
    service = ZeroLossMessageService()
    service.persist_messages([("c1", "e.ops", {}), ("c2", "e.ops", {})])
    with transaction.atomic():
        [lease] = service.claim("e.ops")
        assert recorder.of(Claimed) == []
    [claimed] = recorder.of(Claimed)
    assert claimed.queue_name == "e.ops" and [x.message_id for x in claimed.leases] == [lease.message_id]
    other = "c2" if lease.message_id == "c1" else "c1"
    with transaction.atomic():
        service.cancel_messages([other], actor="alice")
        transaction.set_rollback(True)
    assert recorder.of(Cancelled) == []
    service.cancel_messages([other], actor="alice")
    assert recorder.of(Cancelled) == [Cancelled(other, "e.ops", 0, "alice", "default", "operator")]


def test_a_batch_nobody_wants_registers_nothing_after_commit():
    installed = list(events._subscribers)
    events.subscribe()
    try:
        service = ZeroLossMessageService()
        service.persist_messages([("n1", "e.none", {}), ("n2", "e.none", {}, {})])
        leases = service.claim("e.none", limit=2)
        with transaction.atomic():
            service.record_outcomes([Completion(lease, Verdict.FAIL, error="x") for lease in leases])
            assert connection.run_on_commit == []
    finally:
        events.subscribe(*installed)


@pytest.mark.process
def test_the_stream_and_its_publishers_import_before_django_setup():
    # A process-pool child and the fault suite's probers import the handler path before
    # django.setup(): the events must not pull the models in (AppRegistryNotReady).
    code = "import zeroloss.ledger.events, zeroloss.runtime.processing, zeroloss.runtime.delivery"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
