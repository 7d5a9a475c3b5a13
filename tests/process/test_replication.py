"""Replication against a real PostgreSQL primary and a real streaming standby.

The fixtures start their own cluster (``tests/infra/pgcluster.py``): the machine's PostgreSQL does
not accept replication connections. The ledger is driven by real OS processes
(``tests/infra/replication_child.py``) whose ``DATABASE_URL`` is the primary; the standby is read
directly with psycopg.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.infra.pgcluster import PgCluster

pytestmark = pytest.mark.postgres_only

ROOT = Path(__file__).resolve().parents[2]
STANDBY = "zl-standby-1"
REPLICATED = {"PERSISTENCE_LEVEL": "replicated", "REPLICATION_FACTOR": 2, "REPLICATION_TIMEOUT": 5}


class Run:
    def __init__(self, done: subprocess.CompletedProcess[str]) -> None:
        self.code = done.returncode
        self.out = done.stdout
        self.err = done.stderr

    @property
    def lines(self) -> list[dict[str, Any]]:
        assert self.code == 0, f"child failed ({self.code}): {self.err[-3000:]}"
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]

    @property
    def one(self) -> dict[str, Any]:
        [line] = self.lines
        return line


class Nodes:
    """Runs ``tests.infra.replication_child`` processes against the cluster's primary."""

    def __init__(self, cluster: PgCluster) -> None:
        self.cluster = cluster

    def run(self, role: str, args: dict[str, Any] | None = None, timeout: float = 60) -> Run:
        env = dict(os.environ, DATABASE_URL=self.cluster.url(), PYTHONPATH=str(ROOT))
        env.pop("DJANGO_SETTINGS_MODULE", None)
        done = subprocess.run(
            [sys.executable, "-m", "tests.infra.replication_child", role, json.dumps(args or {})],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Run(done)

    def manage(self, *argv: str, zeroloss: dict[str, Any] | None = None) -> Run:
        return self.run("manage", {"argv": list(argv), "zeroloss": zeroloss or {}})

    def standby_row(self, message_id: str) -> tuple[Any, ...] | None:
        with self.cluster.connect(standby=True) as conn:
            return conn.execute(
                "SELECT payload, status, commit_lsn FROM zeroloss_message WHERE message_id = %s", [message_id]
            ).fetchone()

    def primary_counts(self, message_id: str) -> tuple[int, int, int | None]:
        with self.cluster.connect() as conn:
            row = conn.execute(
                "SELECT count(*), (SELECT count(*) FROM zeroloss_messageevent e JOIN zeroloss_message m "
                "ON m.id = e.message_id WHERE m.message_id = %s), max(commit_lsn) "
                "FROM zeroloss_message WHERE message_id = %s",
                [message_id, message_id],
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), row[2]


@pytest.fixture(scope="session")
def cluster() -> Iterator[PgCluster]:
    pg = PgCluster(standby_name=STANDBY)
    try:
        pg.start()
        env = dict(os.environ, DATABASE_URL=pg.url(), PYTHONPATH=str(ROOT))
        env.pop("DJANGO_SETTINGS_MODULE", None)
        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert migrate.returncode == 0, f"migrate on the test primary failed: {migrate.stderr}"
        pg.start_standby()
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def nodes(cluster: PgCluster) -> Nodes:
    """The cluster with its standby streaming."""
    if cluster.streaming() == 0:
        cluster.start_standby()
    return Nodes(cluster)


def test_replicated_persist_is_confirmed_by_the_standby_and_readable_there(nodes: Nodes) -> None:
    ok = nodes.run("persist", {"message_id": "r-1", "data": {"n": 1}, "zeroloss": REPLICATED}).one
    assert ok["ok"] is True and ok["commit_lsn"] > 0
    assert ok["elapsed"] < REPLICATED["REPLICATION_TIMEOUT"]
    # Confirmed means replayed: the standby serves it now, without waiting.
    row = nodes.standby_row("r-1")
    assert row is not None and row[0] == {"n": 1} and row[1] == "pending"
    report = nodes.run("verify", {"message_id": "r-1", "zeroloss": REPLICATED}).one
    assert report == {
        "valid": True,
        "issues": [],
        "confirmed": 2,
        "required": 2,
        "measured": True,
        "confirmed_by": [STANDBY],
        "detail": report["detail"],
    }
    assert report["detail"].startswith("1 of 1 standby(s) replayed WAL position ")
    batch = nodes.run("persist", {"batch": ["rb-1", "rb-2", "rb-3"], "data": {}, "zeroloss": REPLICATED}).one
    assert batch["ok"] is True and len(set(batch["commit_lsns"])) == 1 and batch["commit_lsns"][0] > 0
    assert all(nodes.standby_row(m) is not None for m in ("rb-1", "rb-2", "rb-3"))
    # Two copies exist; three are not claimed.
    three = nodes.run("verify", {"message_id": "r-1", "zeroloss": {"REPLICATION_FACTOR": 3}}).one
    assert three["valid"] is False and three["confirmed"] == 2
    assert three["issues"][0].startswith("Insufficient replication: 2/3 (1 of 1 standby(s) replayed")


def test_durable_message_gets_a_conservative_bound_on_first_verify(nodes: Nodes) -> None:
    durable = {"REPLICATION_FACTOR": 2}
    assert nodes.run("persist", {"message_id": "d-1", "data": {"n": 2}, "zeroloss": durable}).one["ok"]
    assert nodes.primary_counts("d-1")[2] is None  # durable persistence waits for nobody
    first = nodes.run("verify", {"message_id": "d-1", "zeroloss": durable}).one
    bound = nodes.primary_counts("d-1")[2]
    assert bound is not None and first["confirmed"] in (1, 2)
    deadline = time.monotonic() + 10
    while nodes.run("verify", {"message_id": "d-1", "zeroloss": durable}).one["confirmed"] != 2:
        assert time.monotonic() < deadline, "the standby never confirmed a durable message"
    assert nodes.primary_counts("d-1")[2] == bound  # the first bound is kept


def test_discovery_command_checks_and_stats_with_one_standby(nodes: Nodes) -> None:
    found = nodes.manage("zeroloss_nodes", "discover", "--json", zeroloss={"REPLICATION_FACTOR": 2})
    assert found.code == 0, found.err
    data = json.loads(found.out)
    assert data["discovered"] == [STANDBY]
    [node] = [n for n in data["nodes"] if n["node_id"] == STANDBY]
    assert (node["role"], node["status"], node["state"], node["address"]) == (
        "standby",
        "live",
        "streaming",
        "127.0.0.1",
    )
    assert "/" in node["replay_lsn"]
    assert data["replication"] == {
        "vendor": "postgresql",
        "persistence_level": "durable",
        "replication_factor": 2,
        "standbys_required": 1,
        "standbys_streaming": 1,
        "ok": True,
        "problems": [],
    }
    # The same measurement with a factor one standby cannot meet: exit code 1, reason on stderr.
    short = nodes.manage("zeroloss_nodes", "list", zeroloss={"REPLICATION_FACTOR": 3})
    assert short.code == 1
    assert "Only 1 streaming standby(s); REPLICATION_FACTOR=3 needs 2." in short.err
    assert short.out.splitlines()[0].split() == [
        "NODE",
        "ROLE",
        "STATUS",
        "LAST",
        "SEEN",
        "ADDRESS",
        "STATE",
        "SYNC",
        "REPLAY",
        "LSN",
    ]
    assert "replication: 1 streaming standby(s), 2 required" in short.out and "NOT MET" in short.out
    bad = nodes.manage("zeroloss_nodes", "register")
    assert bad.code == 2 and "register needs a NODE_ID" in bad.err

    assert nodes.run("checks", {"databases": ["default"], "zeroloss": REPLICATED}).one == {"checks": []}
    [[check_id, msg]] = nodes.run(
        "checks", {"databases": ["default"], "zeroloss": {**REPLICATED, "REPLICATION_FACTOR": 3}}
    ).one["checks"]
    assert check_id == "zeroloss.W010"
    assert msg == (
        "Database 'default': Only 1 streaming standby(s); REPLICATION_FACTOR=3 needs 2. Every 'replicated' "
        "persist will raise ReplicationTimeout until enough standbys stream."
    )
    assert nodes.run("stats", {"zeroloss": REPLICATED}).one == {
        "required": 1,
        "available": 1,
        "ok": True,
        "problems": [],
    }
    # The sweep loop refreshes standby liveness by discovery.
    swept = nodes.run("sweep", {"zeroloss": {"NODE_TTL": 30}}).one
    assert swept["nodes"][STANDBY] == ["standby", "streaming"]


def test_standby_down_replicated_persist_times_out_loses_nothing_and_recovers(
    nodes: Nodes, cluster: PgCluster
) -> None:
    cluster.stop_standby()
    assert cluster.wait_streaming(0, 10)
    quick = {**REPLICATED, "REPLICATION_TIMEOUT": 1.0}
    args = {"message_id": "down-1", "data": {"n": 3}, "zeroloss": quick}

    first = nodes.run("persist", args).one
    assert first["ok"] is False and first["error"] == "ReplicationTimeout"
    assert (first["confirmed"], first["required"]) == (1, 2)
    assert 1.0 <= first["elapsed"] < 5.0  # the 1 s wait, plus a bounded commit, plus scheduling
    assert "committed on the primary but only 1/2 copies were confirmed within 1s" in first["text"]
    count, events, lsn = nodes.primary_counts("down-1")
    assert (count, events) == (1, 1) and lsn is not None  # on the primary, audited once

    retry = nodes.run("persist", args).one  # idempotent: same row, still unconfirmed
    assert retry["ok"] is False and retry["confirmed"] == 1
    assert nodes.primary_counts("down-1") == (1, 1, lsn)

    report = nodes.run("verify", {"message_id": "down-1", "zeroloss": quick}).one
    assert report["valid"] is False and report["confirmed"] == 2 - 1
    assert report["issues"] == [
        "Insufficient replication: 1/2 (no streaming standby is attached to the primary: "
        "PostgreSQL holds a single copy)"
    ]
    # Inside transaction.atomic the wait happens at commit, and the error is raised there.
    atomic = nodes.run("persist", {**args, "message_id": "down-2", "atomic": True}).lines
    assert atomic[0] == {"inside_atomic": "returned"} and atomic[1]["error"] == "ReplicationTimeout"
    assert nodes.primary_counts("down-2")[0] == 1

    listed = nodes.manage("zeroloss_nodes", "list", "--json", zeroloss=quick)
    assert listed.code == 1 and "Only 0 streaming standby(s)" in listed.err
    assert json.loads(listed.out)["replication"]["standbys_streaming"] == 0
    [[check_id, msg]] = nodes.run("checks", {"databases": ["default"], "zeroloss": quick}).one["checks"]
    assert check_id == "zeroloss.W010" and "Only 0 streaming standby(s); REPLICATION_FACTOR=2 needs 1." in msg

    # The standby comes back and catches up: the same retry now succeeds, measured 2/2.
    cluster.start_standby()
    again = nodes.run("persist", {**args, "zeroloss": REPLICATED}).one
    assert again["ok"] is True and again["commit_lsn"] == lsn
    assert nodes.run("verify", {"message_id": "down-1", "zeroloss": REPLICATED}).one["confirmed"] == 2
    assert nodes.standby_row("down-1") is not None and nodes.standby_row("down-2") is not None
    assert nodes.primary_counts("down-1") == (1, 1, lsn)


def test_nodes_are_shared_across_processes_and_restarts_and_turn_down_after_ttl(
    nodes: Nodes, cluster: PgCluster
) -> None:
    assert nodes.manage("zeroloss_nodes", "discover").code == 0  # registers the standby
    assert nodes.run("register", {"node_ids": ["app-b", "app-a"]}).one == {"registered": ["app-b", "app-a"]}
    wide = {"REPLICATION_FACTOR": 3, "NODE_TTL": 60}
    assert nodes.run("targets", {"zeroloss": wide}).one == {"targets": ["app-a", "app-b", STANDBY]}
    assert nodes.run("targets", {"zeroloss": {"REPLICATION_FACTOR": 2}}).one == {
        "targets": ["app-a", "app-b"]
    }

    cluster.restart_primary()  # the registry is in the database, so it survives
    assert nodes.run("targets", {"zeroloss": wide}).one["targets"][:2] == ["app-a", "app-b"]

    ttl = nodes.run("ttl", {"zeroloss": {"NODE_TTL": 1.0}}).one
    assert ttl["beating_always_live"] is True
    assert ttl["down_after"] is not None and 1.0 <= ttl["down_after"] < 1.6
    with cluster.connect() as conn:  # every heartbeat past the TTL, by the database's clock
        conn.execute(
            "UPDATE zeroloss_replicationnode SET last_seen_at = statement_timestamp() - interval '2 seconds'"
        )
    listed = nodes.manage("zeroloss_nodes", "list", "--json", zeroloss={"NODE_TTL": 1.0})
    assert listed.code == 0, listed.err
    status = {n["node_id"]: n["status"] for n in json.loads(listed.out)["nodes"]}
    assert status["silent"] == status["beating"] == status["app-a"] == "down"  # kept, shown down
    assert nodes.run("targets", {"zeroloss": {"NODE_TTL": 1.0, "REPLICATION_FACTOR": 3}}).one == {
        "targets": []
    }
    gone = nodes.manage("zeroloss_nodes", "unregister", "app-a")
    assert gone.code == 0 and gone.out.strip() == "unregistered app-a"
    again = nodes.manage("zeroloss_nodes", "unregister", "app-a")
    assert again.code == 1 and "no node 'app-a' is registered" in again.err
