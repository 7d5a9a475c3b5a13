"""Durability and concurrency with real OS processes that are really killed (SIGKILL)."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from django.db import connection

from tests.support import expire_leases
from tests.support.processes import Proc
from tests.support.waiting import hold_for
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_message_persisted_by_killed_process_survives_and_is_claimable(children):
    writer = children.spawn("persist", {"prefix": "crash", "queue": "q", "count": 20, "hang": True})
    assert children.read_line(writer) == {"persisted": 20}
    children.sigkill(writer)
    [result] = children.run("read", {"message_id": "crash-7", "claim": True})
    assert result == {
        "found": True,
        "payload": {"n": 7, "text": "x" * 50},
        "status": "pending",
        "claimed": True,
        "valid": True,
    }
    # A service instance created after the crash ("restart") sees every message.
    from zeroloss.ops.snapshot import compute_snapshot

    assert compute_snapshot(ZeroLossMessageService()).totals["pending"] == 19


def test_killed_worker_lease_expires_and_sweep_requeues_exactly_once(children, live_service):
    live_service.persist_message("job-1", "q", {"work": 1})
    worker = children.spawn("claim_and_hang", {"message_id": "job-1"})
    claim = children.read_line(worker)
    assert claim["token"]
    children.sigkill(worker)
    assert Message.objects.get().status == Status.PROCESSING
    assert live_service.sweep().total == 0  # lease still live
    assert expire_leases(["job-1"]) == 1  # as ACK_TIMEOUT of silence would, by the database clock
    sweeps = [children.spawn("sweep", {}) for _ in range(3)]
    results = [children.finish(p)[0] for p in sweeps]
    assert sorted(len(r["requeued"]) for r in results) == [0, 0, 1]
    assert MessageEvent.objects.filter(reason="lease_expired").count() == 1
    lease = live_service.claim_message("job-1")
    assert lease and lease.attempt == 2
    assert live_service.acknowledge("job-1", claim["token"]) is False
    assert live_service.acknowledge("job-1", lease.token) is True


@pytest.mark.slow
def test_four_concurrent_sweepers_move_500_orphans_exactly_once(children, live_service, tmp_path: Path):
    live_service.persist_messages([(f"o{i}", "q", {"i": i}) for i in range(500)])
    live_service.persist_messages([(f"live{i}", "q", {"i": i}) for i in range(5)])
    holder = children.spawn(
        "hold_and_renew",
        {
            "message_ids": [f"live{i}" for i in range(5)],
            "seconds": 6,
            "renew_every": 0.5,
            "overrides": {"ack_timeout": 600},
        },
    )
    assert len(children.read_line(holder)["tokens"]) == 5
    assert len(live_service.claim("q", limit=500)) == 500
    assert expire_leases([f"o{i}" for i in range(500)]) == 500  # the holder's five stay live
    start = tmp_path / "go"
    sweepers = [children.spawn("sweep", {"start_file": str(start), "batch_size": 5}) for _ in range(4)]
    children.start_together(start, sweepers)
    results = [children.finish(p)[0] for p in sweepers]
    swept = [mid for r in results for mid in r["requeued"]]
    assert len(swept) == 500 and len(set(swept)) == 500
    if connection.vendor == "postgresql":
        # SQLite serialises writers on one lock, so only PostgreSQL really sweeps in parallel.
        assert sum(1 for r in results if r["requeued"]) >= 2, "the sweepers did not actually overlap"
    events = MessageEvent.objects.filter(reason="lease_expired")
    assert events.count() == 500
    per_message = collections.Counter(events.values_list("message__message_id", flat=True))
    assert set(per_message.values()) == {1}
    assert not any(m.startswith("live") for m in per_message)
    [done, *lost] = children.finish(holder, timeout=30)
    assert lost == [] or all("lost" not in line for line in [done, *lost])
    assert Message.objects.filter(message_id__startswith="live", status="processing").count() == 5


@pytest.mark.slow
def test_eight_concurrent_claimers_never_share_a_message(children, live_service, tmp_path: Path):
    live_service.persist_messages([(f"c{i}", "work", {"i": i}) for i in range(2000)])
    start = tmp_path / "go"
    claimers = [
        children.spawn(
            "claim", {"queue": "work", "limit": 10, "start_file": str(start), "instance_id": f"claimer-{n}"}
        )
        for n in range(8)
    ]
    children.start_together(start, claimers)
    results = [children.finish(p, timeout=180)[0]["claims"] for p in claimers]
    claimed = [c[0] for claims in results for c in claims]
    assert len(claimed) == 2000
    assert len(set(claimed)) == 2000, "a message was claimed under two live leases"
    assert sum(1 for claims in results if claims) >= 4, "the claimers did not actually overlap"
    rows = dict(Message.objects.values_list("message_id", "lease_token"))
    for claims in results:
        for message_id, token, _ in claims:
            assert str(rows[message_id]) == token
    assert MessageEvent.objects.filter(reason="claimed").count() == 2000


def test_replication_nodes_are_shared_across_processes_and_restarts(children):
    children.run("register_node", {"node_id": "node-b", "address": "10.0.0.2:5432"})
    children.run("register_node", {"node_id": "node-a", "address": "10.0.0.1:5432"})
    [seen] = children.run("list_nodes", {"overrides": {"replication_factor": 3}})
    assert seen == {"nodes": ["node-a", "node-b"]}
    fresh = ZeroLossMessageService(replication_factor=3)
    assert [n.node_id for n in fresh.get_replication_targets()] == ["node-a", "node-b"]


def _assert_swept_nothing(service: ZeroLossMessageService) -> None:
    assert service.sweep().total == 0


def _assert_running(worker: Proc) -> None:
    assert worker.popen.poll() is None, worker.text


def test_sweep_returns_nothing_while_lease_is_renewed_by_live_process(children, live_service):
    live_service.persist_message("kept", "q", {})
    holder = children.spawn(
        "hold_and_renew",
        {"message_ids": ["kept"], "seconds": 1.5, "renew_every": 0.1, "overrides": {"ack_timeout": 3}},
    )
    children.read_line(holder)
    first = Message.objects.get().lease_expires_at
    assert first is not None
    # the sweep must find nothing for the whole window
    hold_for(1.2, lambda: _assert_swept_nothing(live_service))
    [done] = children.finish(holder)
    assert done == {"done": True}  # every renewal succeeded
    moved = Message.objects.get().lease_expires_at
    assert moved is not None and moved > first  # and moved the lease
    assert live_service.sweep().total == 0  # still live after the holder left
    expire_leases(["kept"])
    assert live_service.sweep().requeued == ["kept"]


@pytest.mark.slow
@pytest.mark.sqlite_only
def test_a_worker_rides_out_sqlite_held_locked_past_its_busy_timeout(tmp_path: Path):
    """On SQLite a transaction elsewhere can hold the only write lock; past the busy timeout the
    worker's statements fail with "database is locked". 0.1 exited 1; now it waits it out."""
    from tests.support.processes import db_worker

    service = ZeroLossMessageService()
    service.persist_messages([(f"s{i}", "demo.record", {}) for i in range(5)])
    worker = db_worker("--queue", "demo.record", "--poll-interval", "0.1", ZEROLOSS_SQLITE_TIMEOUT="0.5")
    try:
        assert wait_until(lambda: Message.objects.filter(status="completed").count() == 5, timeout=30), (
            worker.text
        )
        import sqlite3

        holder = sqlite3.connect(connection.settings_dict["NAME"], timeout=5)
        holder.execute("BEGIN IMMEDIATE")  # a long transaction somewhere else
        # the fault itself: the lock is held past the worker's 0.5 s busy timeout, which it rides out
        hold_for(3, lambda: _assert_running(worker), interval=0.2)
        holder.rollback()
        holder.close()
        service.persist_message("after", "demo.record", {})
        assert wait_until(lambda: Message.objects.filter(status="completed").count() == 6, timeout=30), (
            worker.text
        )
        assert worker.popen.poll() is None, worker.text
        assert "database is locked" in worker.text and "Traceback" not in worker.text
    finally:
        assert worker.terminate() == 0, worker.text


@pytest.mark.sqlite_only
def test_a_lease_renewal_commits_in_turn_behind_a_process_writing_back_to_back(
    children, live_service, tmp_path: Path
):
    """SQLite's busy handler polls with a back-off of up to 100 ms, so a process that commits and
    begins its next transaction at once kept the write lock while another's renewals waited for
    seconds, past their lease. With the write gate each renewal waits its turn: one transaction."""
    import time

    live_service.persist_messages([(f"m{i}", "q", {}) for i in range(8)])
    mine = [live_service.claim_message(f"m{i}") for i in range(3)]
    stop = tmp_path / "stop"
    writer = children.spawn(
        "back_to_back_writer",
        {"message_ids": [f"m{i}" for i in range(3, 8)], "hold": 0.02, "stop_file": str(stop)},
    )
    waits: list[float] = []
    try:
        assert children.read_line(writer) == {"tokens": 5}  # from here it writes back to back
        for _ in range(12):
            started = time.monotonic()
            assert live_service.renew_leases([x for x in mine if x]) == {"m0", "m1", "m2"}
            waits.append(time.monotonic() - started)
            time.sleep(0.05)
    finally:
        stop.touch()
    [result] = children.finish(writer)
    assert result["transactions"] >= 12  # it was writing all along
    # A turn is one 20 ms transaction; the bound leaves a loaded host ample margin yet is far
    # below the seconds a renewal waited without the gate.
    assert max(waits) < 1.5, waits
