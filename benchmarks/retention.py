"""Retention at scale: purging a million completed messages, and what it does to claims.

``python -m benchmarks.retention [--rows N] [--scratch-rows N] [--only real|scratch]`` (or
``python -m benchmarks --only retention``, which runs the same with the suite's sizes).

Everything runs on a private PostgreSQL server started for the run (``tests/infra/pgcluster.py``,
``shared_buffers`` 128MB like the machine's server, ``fsync`` on), so the WAL measured
(``pg_current_wal_lsn()`` before and after) is this benchmark's alone, and the purge does not
slow the machine's other users. It is stopped and removed at the end.

**real**: the migrated zeroloss schema holding ``--rows`` completed messages (each with its
three audit rows: persisted, claimed, acknowledged), loaded set-based (setup, not measured).
``ZeroLossMessageService().purge_messages(older_than=60)`` (what ``zeroloss_purge`` runs:
batches of 1,000, each one transaction deleting the audit rows, the messages and writing a
``PurgeRecord``) runs in a child process, timed there. A claimer process
(``claim(limit=1)`` + ``acknowledge``, paced at ``CLAIM_RATE`` per second) records
each claim's latency, first for ``BASELINE_SECONDS`` without a purge, then during the purge.
The autovacuum that a real purge leaves behind is measured too (``VACUUM`` right after).

**scratch**: the same data in two scratch schemas of the same database, to compare how a purge
is done, not zeroloss's code: ``rows`` holds the tables as they are today (``LIKE ... INCLUDING
ALL``) and is purged with the service's statements, batch by batch; ``parts`` is the proposed
design (docs/scaling.md, "Retention by partition"): messages and audit rows range-partitioned
by the message's ``created_at``, one partition per day, the unique message id kept in an
unpartitioned ``message_key`` table. Purging there is ``DETACH PARTITION ... CONCURRENTLY`` +
``DROP TABLE`` per day, plus a batched delete of that day's keys. A raw-SQL claimer (the
claim and acknowledgement statements zeroloss issues, with their audit rows) measures claim
latency on each schema without and during its purge.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from . import db

ROOT = Path(__file__).resolve().parent.parent
CLAIM_RATE = 200  # claims per second the probe attempts (it measures latency, not throughput)
BASELINE_SECONDS = 20.0
PROBE_PENDING = 100_000
DAYS = 10  # the scratch data spans this many daily partitions, all older than the cutoff
DB_NAME = "zeroloss_retention"


def _log(message: str) -> None:
    print(f"  . {message}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_summary(values: list[float]) -> dict[str, Any]:
    return {
        "claims": len(values),
        "p50_ms": percentile(values, 0.50),
        "p99_ms": percentile(values, 0.99),
        "max_ms": max(values) if values else float("nan"),
        "mean_ms": statistics.fmean(values) if values else float("nan"),
    }


# -- the private server --------------------------------------------------------------------


@contextmanager
def private_server(dbname: str = DB_NAME, **settings: str) -> Iterator[str]:
    """A private PostgreSQL with the machine server's memory settings (and ``settings``, e.g.
    ``autovacuum="off"``); yields the database URL."""
    sys.path.insert(0, str(ROOT))
    from tests.infra.pgcluster import PgCluster

    cluster = PgCluster(dbname=dbname, max_connections=40)
    try:
        cluster.start()
        with cluster.connect(dbname="postgres") as conn:
            chosen = {"shared_buffers": "128MB", "max_wal_size": "1GB", "wal_keep_size": "0", **settings}
            for name, value in chosen.items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        cluster.restart_primary()
        yield cluster.url()
    finally:
        cluster.stop()


def child_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROLOSS_") and k != "CELERY_BROKER_URL"}
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="benchmarks.settings",
        DJANGO_DEBUG="0",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    return env


def manage(url: str, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """``manage.py ARGS`` on ``url``'s database, with the benchmarks' settings; raise if it fails."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=child_env(url),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args[:2])} exited {done.returncode}: {done.stderr[-3000:]}")
    return done


def migrate(url: str) -> None:
    manage(url, "migrate", "--noinput", "-v", "0", timeout=300)


def wal_lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def wal_bytes(conn: psycopg.Connection[Any], start: str, end: str) -> int:
    row = conn.execute("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)::bigint", [end, start]).fetchone()
    assert row is not None
    return int(row[0])


def table_bytes(conn: psycopg.Connection[Any], *tables: str) -> int:
    total = 0
    for table in tables:
        # Every partition's (pg_partition_tree is the table alone when it is not partitioned).
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree(%s::regclass)",
            [table],
        ).fetchone()
        total += int(row[0]) if row else 0
    return total


# -- the claim probe (a child process) -----------------------------------------------------


class Probe:
    """A claimer process: ``start()`` it, ``go()`` to begin, ``stop()`` returns its latencies."""

    def __init__(self, url: str, mode: str, queue: str, schema: str = "") -> None:
        self.stop_file = Path(tempfile.mkstemp(prefix="zl-retention-stop-")[1])
        self.stop_file.unlink()
        args = {"url": url, "mode": mode, "queue": queue, "schema": schema, "stop_file": str(self.stop_file)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.retention", "--child", json.dumps(args)],
            cwd=ROOT,
            env=child_env(url),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith('{"ready"'):
            raise RuntimeError(f"claim probe did not start: {line!r}")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def stop(self) -> dict[str, Any]:
        self.stop_file.touch()
        out, _ = self.proc.communicate(timeout=120)
        self.stop_file.unlink(missing_ok=True)
        if self.proc.returncode != 0:
            raise RuntimeError(f"claim probe failed ({self.proc.returncode})")
        return dict(json.loads(out.strip().splitlines()[-1]))


def within(latencies: dict[str, Any], started_at: float, ended_at: float) -> dict[str, Any]:
    """The summary of the probe's claims that began between two wall-clock times (what ran
    while the operation itself ran, not while its process started and imported Django)."""
    return latency_summary([ms for at, ms in latencies["timeline"] if started_at <= at <= ended_at])


def measured(
    url: str, mode: str, queue: str, schema: str, during: Callable[[], Any] | None
) -> tuple[dict[str, Any], Any]:
    """Claim latencies while ``during()`` runs (or for BASELINE_SECONDS), and what it returned;
    ``timeline`` lists each claim's wall-clock start and latency."""
    probe = Probe(url, mode, queue, schema)
    probe.go()
    try:
        if during is None:
            time.sleep(BASELINE_SECONDS)
            result = None
        else:
            result = during()
    finally:
        latencies = probe.stop()
    return latencies, result


def _scratch_sql(schema: str, partitioned: bool) -> tuple[str, str]:
    carry = ", message_created_at" if partitioned else ""
    carried = ", t.created_at" if partitioned else ""
    claim = (
        f"WITH t AS (UPDATE {schema}.message SET status = 'processing', attempts = attempts + 1, "
        "lease_token = gen_random_uuid(), lease_expires_at = statement_timestamp() + interval '30 seconds', "
        "claimed_by = %(actor)s, started_at = statement_timestamp(), updated_at = statement_timestamp() "
        f"WHERE id = ANY(ARRAY(SELECT id FROM {schema}.message WHERE status = 'pending' AND queue_name = %(queue)s "
        "AND available_at <= statement_timestamp() ORDER BY priority DESC, available_at, id LIMIT 1 "
        "FOR UPDATE SKIP LOCKED)) AND status = 'pending' RETURNING id, message_id, lease_token, attempts, created_at), "
        f"ev AS (INSERT INTO {schema}.event (message_id, from_status, to_status, reason, actor, attempt, detail, "
        f"created_at{carry}) SELECT t.id, 'pending', 'processing', 'claimed', %(actor)s, t.attempts, '', "
        f"statement_timestamp(){carried} FROM t) SELECT message_id, lease_token FROM t"
    )
    ack = (
        f"WITH t AS (UPDATE {schema}.message SET status = 'completed', completed_at = statement_timestamp(), "
        "lease_token = NULL, lease_expires_at = NULL, updated_at = statement_timestamp() "
        "WHERE message_id = %(mid)s AND lease_token = %(tok)s AND status = 'processing' "
        "RETURNING id, attempts, created_at), "
        f"ev AS (INSERT INTO {schema}.event (message_id, from_status, to_status, reason, actor, attempt, detail, "
        f"created_at{carry}) SELECT t.id, 'processing', 'completed', 'acknowledged', %(actor)s, t.attempts, '', "
        f"statement_timestamp(){carried} FROM t) SELECT count(*) FROM t"
    )
    return claim, ack


def child(args: dict[str, Any]) -> int:
    """The claim probe: paced claims of one message, each acknowledged; latencies of the claims."""
    stop = Path(args["stop_file"])
    actor = f"probe-{os.getpid()}"
    claim_latencies: list[float] = []
    claim_starts: list[float] = []
    ack_latencies: list[float] = []
    empty = 0
    if args["mode"] == "send":
        import django

        django.setup()
        import zeroloss

        sent = iter(range(1 << 62))

        def once() -> bool:
            t0 = time.perf_counter()
            zeroloss.send(args["queue"], {"probe": next(sent)})
            claim_latencies.append((time.perf_counter() - t0) * 1000)
            return True

    elif args["mode"] == "service":
        import django

        django.setup()
        from zeroloss.ledger.service import ZeroLossMessageService

        service = ZeroLossMessageService(instance_id=actor)
        service.database_now()

        def once() -> bool:
            t0 = time.perf_counter()
            leases = service.claim(args["queue"], limit=1)
            claim_latencies.append((time.perf_counter() - t0) * 1000)
            for lease in leases:
                t1 = time.perf_counter()
                service.acknowledge(lease.message_id, lease.token)
                ack_latencies.append((time.perf_counter() - t1) * 1000)
            return bool(leases)

    else:
        conn = psycopg.connect(args["url"], autocommit=True, prepare_threshold=0)
        claim, ack = _scratch_sql(args["schema"], args["schema"].startswith("parts"))

        def once() -> bool:
            t0 = time.perf_counter()
            rows = conn.execute(claim, {"actor": actor, "queue": args["queue"]}).fetchall()
            claim_latencies.append((time.perf_counter() - t0) * 1000)
            for mid, tok in rows:
                t1 = time.perf_counter()
                conn.execute(ack, {"mid": mid, "tok": tok, "actor": actor})
                ack_latencies.append((time.perf_counter() - t1) * 1000)
            return bool(rows)

    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
    interval = 1.0 / CLAIM_RATE
    next_at = time.perf_counter()
    while not stop.exists():
        claim_starts.append(time.time())  # wall clock: comparable with the purge child's bounds
        if not once():
            empty += 1
        next_at += interval
        pause = next_at - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        else:
            next_at = time.perf_counter()
    print(
        json.dumps(
            {
                **latency_summary(claim_latencies),
                "ack_p50_ms": percentile(ack_latencies, 0.5),
                "ack_p99_ms": percentile(ack_latencies, 0.99),
                "empty_claims": empty,
                "timeline": [
                    [at, round(ms, 3)] for at, ms in zip(claim_starts, claim_latencies, strict=True)
                ],
            }
        ),
        flush=True,
    )
    return 0


# -- A: the real schema, the real service --------------------------------------------------


def purge_measured(
    conn: psycopg.Connection[Any], url: str, older_than: float, phase: str = "all"
) -> dict[str, Any]:
    """``purge_messages(older_than=...)`` in a child process (the service's own code), and the WAL
    it wrote. ``phase`` (a partitioned ledger): ``drop``, the purge without its key deletes
    afterwards; ``keys``, those deletes alone (``partition_drops.delete_dropped_keys``)."""
    lsn = wal_lsn(conn)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.retention",
            "--purge-child",
            json.dumps({"older_than": older_than, "phase": phase}),
        ],
        cwd=ROOT,
        env=child_env(url),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"purge failed: {done.stderr[-3000:]}")
    result = dict(json.loads(done.stdout.strip().splitlines()[-1]))
    result["wal_bytes"] = wal_bytes(conn, lsn, wal_lsn(conn))
    return result


def run_real(url: str, rows: int) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        load(conn, db.MSG, db.EVT, rows, spread_days=0, carry=True)
        db.analyze(conn, vacuum=True)
        conn.execute("CHECKPOINT")
        _log(
            f"real: loaded {rows:,} completed messages + {3 * rows:,} audit rows in {time.perf_counter() - started:.0f}s"
        )
        size_before = table_bytes(conn, db.MSG, db.EVT)

        baseline, _ = measured(url, "service", "bench.noop", "", None)
        _log(f"real: claims without purge p50 {baseline['p50_ms']:.2f} ms, p99 {baseline['p99_ms']:.2f} ms")

        during, result = measured(url, "service", "bench.noop", "", lambda: purge_measured(conn, url, 60))
        _log(
            f"real: purged {result['purged']:,} in {result['seconds']:.1f}s, WAL {result['wal_bytes'] / 2**20:.0f} MiB"
        )
        _log(f"real: claims during purge p50 {during['p50_ms']:.2f} ms, p99 {during['p99_ms']:.2f} ms")
        lsn = wal_lsn(conn)
        t0 = time.perf_counter()
        conn.execute(f"VACUUM {db.MSG}, {db.EVT}")
        vacuum = {"seconds": time.perf_counter() - t0, "wal_bytes": wal_bytes(conn, lsn, wal_lsn(conn))}
        left = conn.execute(f"SELECT count(*) FROM {db.MSG} WHERE queue_name = 'bench.retention'").fetchone()
        records = conn.execute("SELECT coalesce(sum(count), 0) FROM zeroloss_purgerecord").fetchone()
        size_after = table_bytes(conn, db.MSG, db.EVT)
    return {
        "rows": rows,
        "purge": result,
        "vacuum": vacuum,
        "claims_baseline": baseline,
        "claims_during": during,
        "left": int(left[0]) if left else -1,
        "purge_records": int(records[0]) if records else -1,
        "bytes_before": size_before,
        "bytes_after_vacuum": size_after,
    }


#: The built layout's day to drop: this many days ago, older than the 7-day retention.
DROP_DAYS_AGO = 10
RETENTION_DAYS = 7


def run_partitioned(url: str, rows: int) -> dict[str, Any]:
    """The built layout (a new install's, partitioned by day): ``rows`` completed messages sent
    DROP_DAYS_AGO days ago, their day dropped by ``purge_messages(older_than=7 days)``. Only that
    day's partition is created in the past, so the purge drops one day, as a daily purge does."""
    manage(
        url,
        "shell",
        "-c",
        "import datetime as dt; from django.db import connection; from zeroloss.ledger import partitions as p; "
        f"n = p.database_now(connection); p.create_partitions(connection, n - dt.timedelta(days={DROP_DAYS_AGO}), "
        f"n - dt.timedelta(days={DROP_DAYS_AGO}, seconds=-1), 86400)",
    )
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        load(conn, db.MSG, db.EVT, rows, spread_days=0, carry=True, days_ago=DROP_DAYS_AGO)
        conn.execute(
            f"INSERT INTO {db.KEY} (message_id, created_at) SELECT message_id, created_at FROM {db.MSG}"
        )
        db.analyze(conn, vacuum=True)
        conn.execute(f"VACUUM (ANALYZE) {db.KEY}")
        conn.execute("CHECKPOINT")
        _log(f"partitioned: loaded {rows:,} completed messages in {time.perf_counter() - started:.0f}s")
        size_before = table_bytes(conn, db.MSG, db.EVT)
        baseline, _ = measured(url, "service", "bench.noop", "", None)
        _log(
            f"partitioned: claims without purge p50 {baseline['p50_ms']:.2f} ms, p99 {baseline['p99_ms']:.2f} ms"
        )

        whole, result = measured(
            url,
            "service",
            "bench.noop",
            "",
            lambda: purge_measured(conn, url, RETENTION_DAYS * 86400, "drop"),
        )
        during = within(whole, result["started_at"], result["ended_at"])
        _log(
            f"partitioned: dropped {result['purged']:,} in {result['seconds']:.1f}s, "
            f"WAL {result['wal_bytes'] / 2**20:.0f} MiB"
        )
        whole_keys, keys = measured(
            url,
            "service",
            "bench.noop",
            "",
            lambda: purge_measured(conn, url, RETENTION_DAYS * 86400, "keys"),
        )
        during_keys = within(whole_keys, keys["started_at"], keys["ended_at"])
        _log(
            f"partitioned: then {keys['keys_deleted']:,} keys deleted in {keys['seconds']:.1f}s, "
            f"WAL {keys['wal_bytes'] / 2**20:.0f} MiB"
        )
        left = conn.execute(f"SELECT count(*) FROM {db.MSG} WHERE queue_name = 'bench.retention'").fetchone()
        records = conn.execute("SELECT coalesce(sum(count), 0) FROM zeroloss_purgerecord").fetchone()
    return {
        "rows": rows,
        "purge": result,
        "claims_baseline": baseline,
        "claims_during": during,
        "claims_purge_process": whole,
        "keys": keys,
        "claims_during_keys": during_keys,
        "claims_keys_process": whole_keys,
        "left": int(left[0]) if left else -1,
        "purge_records": int(records[0]) if records else -1,
        "bytes_before": size_before,
    }


def migrate_unpartitioned(url: str) -> None:
    """A ledger as 0.2 left it and ``migrate`` upgraded it: migrated to 0009, a message stored,
    then to the end (0010 leaves a populated ledger unpartitioned)."""
    manage(url, "migrate", "zeroloss", "0009", "--noinput", "-v", "0", timeout=300)
    manage(url, "shell", "-c", "import zeroloss; zeroloss.send('bench.noop', {'seed': 1})")
    migrate(url)


def run_convert(url: str, rows: int) -> dict[str, Any]:
    """An upgraded unpartitioned ledger of ``rows`` completed messages (and their audit rows)
    converted by ``zeroloss_partition convert`` while a claimer claims and acknowledges and a
    producer sends, each at CLAIM_RATE a second: their latencies during the conversion (the
    longest is the longest any of them waited for a lock)."""
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        load(conn, db.MSG, db.EVT, rows, spread_days=0, carry=True)
        conn.execute(
            f"INSERT INTO {db.KEY} (message_id, created_at) SELECT message_id, created_at FROM {db.MSG} "
            "ON CONFLICT DO NOTHING"
        )
        db.analyze(conn, vacuum=True)
        conn.execute("CHECKPOINT")
        _log(f"convert: loaded {rows:,} completed messages in {time.perf_counter() - started:.0f}s")
        baseline, _ = measured(url, "service", "bench.noop", "", None)
        _log(f"convert: claims before p50 {baseline['p50_ms']:.2f} ms, p99 {baseline['p99_ms']:.2f} ms")
        sender = Probe(url, "send", "bench.noop")
        sender.go()

        def conversion() -> dict[str, Any]:
            t0 = time.perf_counter()
            done = manage(url, "zeroloss_partition", "convert", "--yes", timeout=3600)
            held = re.search(r"locks held (\d+) ms", done.stderr)
            return {
                "seconds": time.perf_counter() - t0,
                "swap_lock_ms": int(held[1]) if held else -1,
                "log": done.stderr.strip().splitlines(),
            }

        try:
            during, result = measured(url, "service", "bench.noop", "", conversion)
        finally:
            sends = sender.stop()
        _log(
            f"convert: {result['seconds']:.1f}s, swap held its locks {result['swap_lock_ms']} ms; claims during "
            f"p50 {during['p50_ms']:.2f} ms, p99 {during['p99_ms']:.2f} ms, max {during['max_ms']:.0f} ms; sends max "
            f"{sends['max_ms']:.0f} ms"
        )
        partitioned = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = 'zeroloss_message'::regclass)"
        ).fetchone()
    return {
        "rows": rows,
        "convert": result,
        "claims_baseline": baseline,
        "claims_during": during,
        "sends_during": sends,
        "partitioned": bool(partitioned and partitioned[0]),
    }


def purge_child(args: dict[str, Any]) -> int:
    import django

    django.setup()
    from django.db import connection

    from zeroloss.ledger import partition_drops
    from zeroloss.ledger.service import ZeroLossMessageService

    service = ZeroLossMessageService(instance_id="retention-bench")
    phase = args.get("phase", "all")
    # Wall-clock bounds of the operation itself, for the probe's claims (benchmarks' within()).
    started_at, t0 = time.time(), time.perf_counter()
    if phase == "keys":
        keys = partition_drops.delete_dropped_keys(connection)
        seconds, ended_at = time.perf_counter() - t0, time.time()
        print(
            json.dumps(
                {
                    "purged": 0,
                    "keys_deleted": keys,
                    "seconds": seconds,
                    "started_at": started_at,
                    "ended_at": ended_at,
                }
            ),
            flush=True,
        )
        return 0
    if phase == "drop":  # the purge as it is, its key deletes left for the phase "keys"
        partition_drops.delete_dropped_keys = lambda conn, **kwargs: 0
    purged = service.purge_messages(older_than=float(args.get("older_than", 60)))
    seconds, ended_at = time.perf_counter() - t0, time.time()
    print(
        json.dumps({"purged": purged, "seconds": seconds, "started_at": started_at, "ended_at": ended_at}),
        flush=True,
    )
    return 0


# -- B: scratch schemas, row-by-row against partitions -------------------------------------


def _indexdefs(conn: psycopg.Connection[Any], table: str) -> list[str]:
    rows = conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename = %s ORDER BY indexname",
        [table],
    ).fetchall()
    return [str(r[0]) for r in rows]


def create_scratch(conn: psycopg.Connection[Any]) -> None:
    conn.execute("DROP SCHEMA IF EXISTS rows_s CASCADE")
    conn.execute("DROP SCHEMA IF EXISTS parts_s CASCADE")
    conn.execute("CREATE SCHEMA rows_s")
    conn.execute(f"CREATE TABLE rows_s.message (LIKE public.{db.MSG} INCLUDING ALL)")
    conn.execute(f"CREATE TABLE rows_s.event (LIKE public.{db.EVT} INCLUDING ALL)")
    conn.execute("CREATE TABLE rows_s.purgerecord (LIKE public.zeroloss_purgerecord INCLUDING ALL)")

    conn.execute("CREATE SCHEMA parts_s")
    conn.execute("CREATE SEQUENCE parts_s.message_id_seq")
    conn.execute("CREATE SEQUENCE parts_s.event_id_seq")
    conn.execute(
        f"CREATE TABLE parts_s.message (LIKE public.{db.MSG} INCLUDING DEFAULTS) PARTITION BY RANGE (created_at)"
    )
    conn.execute("ALTER TABLE parts_s.message ALTER id SET DEFAULT nextval('parts_s.message_id_seq')")
    conn.execute(
        f"CREATE TABLE parts_s.event (LIKE public.{db.EVT} INCLUDING DEFAULTS, message_created_at timestamptz NOT NULL) "
        "PARTITION BY RANGE (message_created_at)"
    )
    conn.execute("ALTER TABLE parts_s.event ALTER id SET DEFAULT nextval('parts_s.event_id_seq')")
    conn.execute("CREATE TABLE parts_s.purgerecord (LIKE public.zeroloss_purgerecord INCLUDING ALL)")
    # The global idempotency key: message_id is unique across every partition here.
    conn.execute(
        "CREATE TABLE parts_s.message_key (message_id varchar(255) PRIMARY KEY, created_day date NOT NULL)"
    )
    conn.execute("CREATE INDEX ON parts_s.message_key (created_day)")
    for table, target, key in ((db.MSG, "message", "created_at"), (db.EVT, "event", "message_created_at")):
        for indexdef in _indexdefs(conn, table):
            columns = indexdef.split(" USING ", 1)[1]
            if indexdef.startswith("CREATE UNIQUE INDEX") and "(id)" in columns:
                conn.execute(f"ALTER TABLE parts_s.{target} ADD PRIMARY KEY (id, {key})")
                continue
            # unique(message_id) cannot be global on a partitioned table: message_key holds it
            conn.execute(f"CREATE INDEX ON parts_s.{target} USING {columns}")
    # one partition per day: DAYS old ones (to purge), today's and tomorrow's (the live ledger)
    for day in range(-DAYS - 1, 2):
        for target in ("message", "event"):
            conn.execute(
                f"CREATE TABLE parts_s.{target}_d{day + DAYS + 1} PARTITION OF parts_s.{target} FOR VALUES "
                f"FROM (current_date + {day}) TO (current_date + {day + 1})"
            )


def load(
    conn: psycopg.Connection[Any],
    msg: str,
    evt: str,
    rows: int,
    *,
    spread_days: int,
    carry: bool = False,
    days_ago: int = 0,
) -> None:
    """``rows`` completed messages (persisted, claimed, acknowledged: three audit rows each) and
    PROBE_PENDING pending ones for the claim probe, set-based, in one transaction.

    ``spread_days`` 0: completed an hour ago (``days_ago``: sent on that day, at noon UTC);
    otherwise created at noon on one of the ``spread_days`` days before today. ``carry``: the
    audit table has ``message_created_at``.
    """
    payload = "format('{\"n\":%%s}', g)"
    if spread_days:
        created = f"(current_date - 1 - (g %% {spread_days}) + time '12:00')::timestamptz"
    elif days_ago:
        created = f"((now() AT TIME ZONE 'UTC')::date - {int(days_ago)} + time '12:00') AT TIME ZONE 'UTC'"
    else:
        created = "(now() - interval '1 hour')"
    columns = (
        "message_id, queue_name, payload, checksum, status, attempts, max_attempts, priority, ordering_key, "
        "available_at, claimed_by, last_error, replication_targets, created_at, updated_at, completed_at"
    )
    checksum = f"encode(sha256(convert_to({payload}, 'UTF8')), 'hex')"
    extra, extra_value = (", message_created_at", ", m.created_at") if carry else ("", "")
    events = f"INSERT INTO {evt} (message_id, from_status, to_status, reason, actor, attempt, detail, created_at{extra}) "
    with conn.transaction():
        conn.execute(
            f"INSERT INTO {msg} ({columns}) SELECT 'ret-' || g, 'bench.retention', ({payload})::jsonb, {checksum}, "
            f"'completed', 1, 5, 0, '', {created}, 'old-worker', '', '[]'::jsonb, {created}, {created}, "
            f"{created} + interval '1 second' FROM generate_series(1, %s) g",
            [rows],
        )
        conn.execute(
            f"INSERT INTO {msg} ({columns}) SELECT 'probe-' || g, 'bench.noop', ({payload})::jsonb, {checksum}, "
            "'pending', 0, 5, 0, '', now(), '', '', '[]'::jsonb, now(), now(), NULL FROM generate_series(1, %s) g",
            [PROBE_PENDING],
        )
        for from_status, to_status, reason, attempt, offset in (
            ("", "pending", "persisted", 0, "0 seconds"),
            ("pending", "processing", "claimed", 1, "0.5 seconds"),
            ("processing", "completed", "acknowledged", 1, "1 second"),
        ):
            conn.execute(
                events + f"SELECT m.id, %s, %s, %s, 'loader', %s, '', m.created_at + interval '{offset}'"
                f"{extra_value} FROM {msg} m WHERE m.queue_name = 'bench.retention' ORDER BY m.id",
                [from_status, to_status, reason, attempt],
            )
        conn.execute(
            events + f"SELECT m.id, '', 'pending', 'persisted', 'loader', 0, '', m.created_at{extra_value} "
            f"FROM {msg} m WHERE m.queue_name = 'bench.noop'"
        )


def load_scratch(conn: psycopg.Connection[Any], rows: int) -> None:
    load(conn, "rows_s.message", "rows_s.event", rows, spread_days=DAYS)
    load(conn, "parts_s.message", "parts_s.event", rows, spread_days=DAYS, carry=True)
    conn.execute("INSERT INTO parts_s.message_key SELECT message_id, created_at::date FROM parts_s.message")
    conn.execute(
        "VACUUM (ANALYZE) rows_s.message, rows_s.event, parts_s.message, parts_s.event, parts_s.message_key"
    )
    conn.execute("CHECKPOINT")


def purge_rows(conn: psycopg.Connection[Any], batch: int = 1000) -> int:
    """The service's purge, statement for statement (zeroloss.ledger.operator.purge_messages)."""
    purged = 0
    while True:
        with conn.transaction():
            rows = conn.execute(
                "SELECT id, queue_name FROM rows_s.message WHERE status = 'completed' AND completed_at < current_date "
                "ORDER BY completed_at LIMIT %s FOR UPDATE SKIP LOCKED",
                [batch],
            ).fetchall()
            if not rows:
                break
            ids = [r[0] for r in rows]
            conn.execute("DELETE FROM rows_s.event WHERE message_id = ANY(%s)", [ids])
            conn.execute("DELETE FROM rows_s.message WHERE id = ANY(%s)", [ids])
            conn.execute(
                "INSERT INTO rows_s.purgerecord (queue_name, status, count, actor, purged_at) "
                "VALUES ('bench.retention', 'completed', %s, 'bench', now())",
                [len(ids)],
            )
        purged += len(rows)
        if len(rows) < batch:
            break
    return purged


def purge_parts(conn: psycopg.Connection[Any], key_batch: int = 10_000) -> dict[str, Any]:
    """The proposed purge: per day older than the cutoff, detach, check, count, drop; then its keys."""
    purged = 0
    key_seconds = 0.0
    partitions = conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'parts_s.message'::regclass ORDER BY c.relname"
    ).fetchall()
    for name, bound in partitions:
        row = conn.execute(
            "SELECT (regexp_match(%(b)s, 'FROM \\(''([^'']+)''\\)'))[1]::timestamptz::date, "
            "(regexp_match(%(b)s, 'TO \\(''([^'']+)''\\)'))[1]::timestamptz <= current_date",
            {"b": bound},
        ).fetchone()
        if row is None or not row[1]:
            continue  # not entirely older than the cutoff (today's and tomorrow's partitions)
        first_day = row[0]
        day = str(name).removeprefix("message_")
        # DETACH ... CONCURRENTLY: the parent keeps serving claims (SHARE UPDATE EXCLUSIVE only)
        conn.execute(f"ALTER TABLE parts_s.message DETACH PARTITION parts_s.{name} CONCURRENTLY")
        conn.execute(f"ALTER TABLE parts_s.event DETACH PARTITION parts_s.event_{day} CONCURRENTLY")
        with conn.transaction():
            counts = conn.execute(
                f"SELECT queue_name, status, count(*) FROM parts_s.{name} GROUP BY 1, 2"
            ).fetchall()
            if any(status not in ("completed", "dead") for _q, status, _n in counts):
                raise RuntimeError(f"{name} holds live messages: re-attach it, do not drop it")
            for queue, status, n in counts:
                conn.execute(
                    "INSERT INTO parts_s.purgerecord (queue_name, status, count, actor, purged_at) "
                    "VALUES (%s, %s, %s, 'bench', now())",
                    [queue, status, n],
                )
                purged += int(n)
            conn.execute(f"DROP TABLE parts_s.{name}, parts_s.event_{day}")
        t0 = time.perf_counter()
        while True:
            with conn.transaction():
                gone = conn.execute(
                    "DELETE FROM parts_s.message_key WHERE message_id = ANY(ARRAY(SELECT message_id FROM "
                    "parts_s.message_key WHERE created_day = %s LIMIT %s))",
                    [first_day, key_batch],
                ).rowcount
            if gone < key_batch:
                break
        key_seconds += time.perf_counter() - t0
    return {"purged": purged, "key_delete_seconds": key_seconds}


def run_scratch(url: str, rows: int) -> dict[str, Any]:
    out: dict[str, Any] = {"rows": rows}
    with psycopg.connect(url, autocommit=True) as conn:
        started = time.perf_counter()
        create_scratch(conn)
        load_scratch(conn, rows)
        _log(
            f"scratch: loaded {rows:,} completed messages into each schema in {time.perf_counter() - started:.0f}s"
        )
        for schema, purge in (("rows_s", purge_rows), ("parts_s", purge_parts)):
            baseline, _ = measured(url, "raw", "bench.noop", schema, None)
            size_before = table_bytes(conn, f"{schema}.message", f"{schema}.event")

            def timed(purge: Callable[[psycopg.Connection[Any]], Any] = purge) -> dict[str, Any]:
                with psycopg.connect(url, autocommit=True) as purger:
                    lsn = wal_lsn(purger)
                    t0 = time.perf_counter()
                    result = purge(purger)
                    seconds = time.perf_counter() - t0
                    return {
                        "seconds": seconds,
                        "wal_bytes": wal_bytes(purger, lsn, wal_lsn(purger)),
                        "result": result,
                    }

            during, result = measured(url, "raw", "bench.noop", schema, timed)
            lsn = wal_lsn(conn)
            t0 = time.perf_counter()
            tables = f"{schema}.message, {schema}.event" + (
                ", parts_s.message_key" if schema == "parts_s" else ""
            )
            conn.execute(f"VACUUM {tables}")
            vacuum = {"seconds": time.perf_counter() - t0, "wal_bytes": wal_bytes(conn, lsn, wal_lsn(conn))}
            left = conn.execute(
                f"SELECT count(*) FROM {schema}.message WHERE queue_name = 'bench.retention'"
            ).fetchone()
            out[schema] = {
                "purge": result,
                "vacuum": vacuum,
                "claims_baseline": baseline,
                "claims_during": during,
                "left": int(left[0]) if left else -1,
                "bytes_before": size_before,
            }
            _log(
                f"scratch {schema}: purge {result['seconds']:.1f}s, WAL {result['wal_bytes'] / 2**20:.0f} MiB, "
                f"vacuum {vacuum['seconds']:.1f}s / {vacuum['wal_bytes'] / 2**20:.0f} MiB; claims p50/p99 "
                f"{baseline['p50_ms']:.2f}/{baseline['p99_ms']:.2f} ms without, "
                f"{during['p50_ms']:.2f}/{during['p99_ms']:.2f} ms during"
            )
    return out


# -- report --------------------------------------------------------------------------------


def report(results: dict[str, Any]) -> str:
    mib = 2**20
    lines = [
        f"load average at start {results['loadavg_start'][0]:.2f}, at end {results['loadavg_end'][0]:.2f}"
    ]
    real = results.get("real")
    if real:
        p, v, b, d = real["purge"], real["vacuum"], real["claims_baseline"], real["claims_during"]
        lines += [
            f"real schema, {real['rows']:,} completed messages + {3 * real['rows']:,} audit rows "
            f"({real['bytes_before'] / mib:,.0f} MiB with indexes):",
            f"  purge_messages(older_than=60): {p['purged']:,} purged in {p['seconds']:.1f}s "
            f"({p['purged'] / p['seconds']:,.0f} msg/s), WAL {p['wal_bytes'] / mib:,.0f} MiB "
            f"({p['wal_bytes'] / max(p['purged'], 1):,.0f} B/message); left {real['left']}, "
            f"PurgeRecord total {real['purge_records']:,}",
            f"  VACUUM afterwards: {v['seconds']:.1f}s, WAL {v['wal_bytes'] / mib:,.0f} MiB; "
            f"tables + indexes after: {real['bytes_after_vacuum'] / mib:,.0f} MiB",
            f"  claim_next(1) latency without purge: p50 {b['p50_ms']:.2f} ms, p99 {b['p99_ms']:.2f} ms "
            f"({b['claims']:,} claims); during purge: p50 {d['p50_ms']:.2f} ms, p99 {d['p99_ms']:.2f} ms, "
            f"max {d['max_ms']:.1f} ms ({d['claims']:,} claims)",
            f"  acknowledge latency p50/p99: {b['ack_p50_ms']:.2f}/{b['ack_p99_ms']:.2f} ms without, "
            f"{d['ack_p50_ms']:.2f}/{d['ack_p99_ms']:.2f} ms during",
        ]
    built = results.get("partitioned")
    if built:
        p, b, d = built["purge"], built["claims_baseline"], built["claims_during"]
        lines += [
            f"built partitioned layout, {built['rows']:,} completed messages sent {DROP_DAYS_AGO} days ago + "
            f"{3 * built['rows']:,} audit rows ({built['bytes_before'] / mib:,.0f} MiB with indexes, every partition):",
            f"  purge_messages(older_than={RETENTION_DAYS} days): {p['purged']:,} dropped in {p['seconds']:.1f}s, "
            f"WAL {p['wal_bytes'] / mib:,.1f} MiB ({p['wal_bytes'] / max(p['purged'], 1):,.0f} B/message); "
            f"left {built['left']}, PurgeRecord total {built['purge_records']:,}",
            f"  then its keys deleted ({built['keys']['keys_deleted']:,}, in batches): "
            f"{built['keys']['seconds']:.1f}s, WAL {built['keys']['wal_bytes'] / mib:,.1f} MiB",
            f"  claim_next(1) latency without purge: p50 {b['p50_ms']:.2f} ms, p99 {b['p99_ms']:.2f} ms "
            f"({b['claims']:,} claims); during the drop: p50 {d['p50_ms']:.2f} ms, p99 {d['p99_ms']:.2f} ms, "
            f"max {d['max_ms']:.1f} ms ({d['claims']:,} claims)",
        ]
        k = built["claims_during_keys"]
        lines.append(
            f"  during the key deletes: p50 {k['p50_ms']:.2f} ms, p99 {k['p99_ms']:.2f} ms, "
            f"max {k['max_ms']:.1f} ms ({k['claims']:,} claims)"
        )
        for key, label in (
            ("claims_purge_process", "the drop's"),
            ("claims_keys_process", "the key deletes'"),
        ):
            w = built.get(key)
            if w:
                lines.append(
                    f"  while {label} whole process ran (Python start-up and Django setup included): p50 "
                    f"{w['p50_ms']:.2f} ms, p99 {w['p99_ms']:.2f} ms, max {w['max_ms']:.1f} ms ({w['claims']:,} claims)"
                )
    converted = results.get("convert")
    if converted:
        c, b, d, s = (converted[k] for k in ("convert", "claims_baseline", "claims_during", "sends_during"))
        lines += [
            f"zeroloss_partition convert of an upgraded unpartitioned ledger, {converted['rows']:,} completed "
            f"messages + {3 * converted['rows']:,} audit rows, under claims + acks and sends ({CLAIM_RATE}/s each):",
            f"  converted in {c['seconds']:.1f}s (partitioned: {converted['partitioned']}); the swap held its "
            f"ACCESS EXCLUSIVE locks {c['swap_lock_ms']} ms",
            f"  claim_next(1) latency before: p50 {b['p50_ms']:.2f} ms, p99 {b['p99_ms']:.2f} ms, max "
            f"{b['max_ms']:.1f} ms; during: p50 {d['p50_ms']:.2f} ms, p99 {d['p99_ms']:.2f} ms, max "
            f"{d['max_ms']:.1f} ms ({d['claims']:,} claims)",
            f"  acknowledge p50/p99 during: {d['ack_p50_ms']:.2f}/{d['ack_p99_ms']:.2f} ms; send latency during: "
            f"p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms, max {s['max_ms']:.1f} ms ({s['claims']:,} sends)",
        ]
    scratch = results.get("scratch")
    if scratch:
        lines.append(
            f"scratch schemas, {scratch['rows']:,} completed messages each, over {DAYS} daily partitions:"
        )
        for schema, label in (("rows_s", "row by row (today)"), ("parts_s", "partition drop (proposed)")):
            s = scratch[schema]
            p, v, b, d = s["purge"], s["vacuum"], s["claims_baseline"], s["claims_during"]
            extra = ""
            if schema == "parts_s":
                extra = f" (of which message_key deletes {p['result']['key_delete_seconds']:.1f}s)"
            lines.append(
                f"  {label}: purge {p['seconds']:.1f}s{extra}, WAL {p['wal_bytes'] / mib:,.0f} MiB; VACUUM "
                f"{v['seconds']:.1f}s, WAL {v['wal_bytes'] / mib:,.0f} MiB; claim p50/p99 {b['p50_ms']:.2f}/"
                f"{b['p99_ms']:.2f} ms without, {d['p50_ms']:.2f}/{d['p99_ms']:.2f} ms during (max {d['max_ms']:.1f}); "
                f"ack p50/p99 {b['ack_p50_ms']:.2f}/{b['ack_p99_ms']:.2f} ms; left {s['left']}"
            )
    return "\n".join(lines)


def run(rows: int, scratch_rows: int, only: str | None = None) -> dict[str, Any]:
    results: dict[str, Any] = {"loadavg_start": os.getloadavg()}
    with private_server() as url:
        if only == "convert":
            migrate_unpartitioned(url)
            results["convert"] = run_convert(url, rows)
        else:
            migrate(url)
        if only in (None, "real"):
            results["real"] = run_real(url, rows)
        if only == "partitioned":
            results["partitioned"] = run_partitioned(url, rows)
        if only in (None, "scratch"):
            results["scratch"] = run_scratch(url, scratch_rows)
    results["loadavg_end"] = os.getloadavg()
    return results


def run_in_suite(suite: Any) -> None:
    """``python -m benchmarks --only retention``: the suite's retained size, printed after the table."""
    rows = suite.sizes.retained
    results = run(rows, rows)
    print("\nretention:\n" + report(results), flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(json.loads(argv[1]))
    if argv[:1] == ["--purge-child"]:
        return purge_child(json.loads(argv[1]))
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.retention",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="Completed messages in the real schema.")
    parser.add_argument("--scratch-rows", type=int, default=1_000_000, help="... in each scratch schema.")
    parser.add_argument(
        "--only",
        choices=["real", "scratch", "partitioned", "convert"],
        help="partitioned: a day of --rows completed messages dropped by the built layout's purge; "
        "convert: an upgraded unpartitioned ledger of --rows converted online under claims and sends.",
    )
    parser.add_argument("--json", type=Path, help="Also save the figures to this file.")
    args = parser.parse_args(argv)
    started = time.monotonic()
    results = run(args.rows, args.scratch_rows, args.only)
    print(report(results))
    print(f"total {time.monotonic() - started:.0f}s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
