"""What one ledger snapshot costs as completed history grows (issue 17.8).

    python -m benchmarks.bench_snapshot [--sizes 1000000 10000000] [--runs 7] [--keep-db] [--reuse]

Creates its own PostgreSQL database (``--db-name``, default ``zeroloss_bench_snapshot``) on the
server of ``--server-url`` / ``ZEROLOSS_BENCH_POSTGRES_URL`` / ``ZEROLOSS_TEST_POSTGRES_URL``,
migrates it and loads a live working set through the service: 10,000 pending messages in
four queues (a quarter of them delayed), 200 processing (50 with an expired lease), 1,000
dead letters and a few sweep recoveries. Then, for each size in ``--sizes`` (ascending), it
bulk-loads completed messages with ``INSERT ... SELECT generate_series`` until that many are
retained, runs ``VACUUM ANALYZE`` (what autovacuum does in production) and times, warm:

- ``compute_snapshot``: :func:`zeroloss.snapshot.compute_snapshot` of the checked-out code
  (the uncached read every metrics/health/status cache miss pays);
- ``full GROUP BY``: the counts the snapshot read before issue 17.8, ``SELECT queue_name,
  status, count(*) ... GROUP BY 1, 2`` over the whole table, for comparison in the same run.

It prints one line per figure (median and min-max of ``--runs`` runs) and how far the
snapshot's completed count is from the exact one. Audit rows are loaded for the live set
only: the snapshot reads the audit trail only for sweep recoveries, through the
``(reason, created_at)`` index, so acknowledged events do not change its cost. The database
is dropped at the end unless ``--keep-db``; ``--reuse`` keeps the rows a previous
``--keep-db`` run left. Never gates on a number.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.db import MSG, BenchDatabase, server_url  # noqa: E402

QUEUES = ("orders", "emails", "sms", "webhooks")
#: Completed rows per INSERT statement while loading (one transaction each).
LOAD_CHUNK = 1_000_000
FULL_GROUP_BY = f"SELECT queue_name, status, count(*) FROM {MSG} GROUP BY queue_name, status"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_snapshot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[1_000_000, 10_000_000],
        help="Completed rows retained at each measurement (ascending).",
    )
    parser.add_argument("--runs", type=int, default=7, help="Timed runs per figure (the median is shown).")
    parser.add_argument("--server-url", help="Any database URL on the PostgreSQL server to use.")
    parser.add_argument(
        "--db-name", default="zeroloss_bench_snapshot", help="The database to create and drop."
    )
    parser.add_argument("--keep-db", action="store_true", help="Do not drop the database at the end.")
    parser.add_argument("--reuse", action="store_true", help="Keep the rows a previous --keep-db run left.")
    args = parser.parse_args(argv)
    if args.runs < 1 or any(s < 0 for s in args.sizes) or args.sizes != sorted(args.sizes):
        parser.error("--runs must be >= 1 and --sizes ascending, >= 0")
    return args


def _log(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load_live_set() -> None:
    """Pending, processing (some stuck), dead and recovered messages, written by the service."""
    from zeroloss.models import Message
    from zeroloss.service import ZeroLossMessageService

    service = ZeroLossMessageService(instance_id="bench-live")
    # First a few sweep recoveries, so the audit-trail part of the snapshot has something to count.
    service.persist_messages([(f"recovered-{i}", "orders", {"i": i}) for i in range(100)])
    assert len(service.claim_next("orders", limit=100)) == 100
    Message.objects.filter(message_id__startswith="recovered-").update(
        lease_expires_at="2000-01-01T00:00:00Z"
    )
    assert ZeroLossMessageService(instance_id="bench-sweeper").recover_orphaned_messages().total == 100
    for n, queue in enumerate(QUEUES):
        # Claims take the oldest message first: dead letters before the rest of the queue.
        service.persist_messages([(f"dead-{queue}-{i}", queue, {"i": i}) for i in range(250)], max_attempts=1)
        for lease in service.claim_next(queue, limit=350 if n == 0 else 250):
            if lease.message_id.startswith("dead-"):
                assert service.mark_failed(lease.message_id, lease.token, "bench: failed on purpose")
            else:
                assert service.release_lease(lease.message_id, lease.token)
        service.persist_messages([(f"live-{queue}-{i}", queue, {"i": i}) for i in range(1_875)])
        service.persist_messages([(f"later-{queue}-{i}", queue, {"i": i}) for i in range(625)], delay=3600)
        leases = service.claim_next(queue, limit=50)
        assert len(leases) == 50, leases
        if n == 0:  # this queue's leases expire: 50 stuck messages
            ids = [lease.message_id for lease in leases]
            Message.objects.filter(message_id__in=ids).update(lease_expires_at="2000-01-01T00:00:00Z")


def completed_count(conn: Any) -> int:
    row = conn.execute(f"SELECT count(*) FROM {MSG} WHERE status = 'completed'").fetchone()
    return int(row[0])


def load_completed(conn: Any, start: int, stop: int) -> None:
    """Completed messages ``start+1 .. stop`` over the four queues, as the service leaves them."""
    payload = "format('{\"n\":%%s}', g)"  # %% : the statement has parameters
    for lo in range(start, stop, LOAD_CHUNK):
        hi = min(lo + LOAD_CHUNK, stop)
        began = time.perf_counter()
        with conn.transaction():
            conn.execute("SET LOCAL synchronous_commit TO off")  # setup only, never measured
            conn.execute(
                f"INSERT INTO {MSG} (message_id, queue_name, payload, checksum, status, attempts, "
                "max_attempts, available_at, claimed_by, last_error, replication_targets, created_at, "
                "updated_at, completed_at) "
                f"SELECT 'done-' || g, (ARRAY{list(QUEUES)!r})[1 + g %% {len(QUEUES)}], ({payload})::jsonb, "
                f"encode(sha256(convert_to({payload}, 'UTF8')), 'hex'), 'completed', 1, 5, "
                "now() - interval '2 days', 'bench-old-worker', '', '[]'::jsonb, "
                "now() - interval '2 days', now() - interval '1 day', now() - interval '1 day' "
                "FROM generate_series(%s::bigint, %s::bigint) AS g",
                [lo + 1, hi],
            )
        _log(f"loaded completed rows {lo + 1:,}..{hi:,} in {time.perf_counter() - began:.1f}s")


def timed(fn: Any, runs: int) -> list[float]:
    fn()  # warm: caches, plans, buffers
    values = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        values.append(time.perf_counter() - began)
    return values


def fmt(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):9.1f} ms  ({min(ms):.1f}-{max(ms):.1f})"


def measure(conn: Any, size: int, runs: int) -> dict[str, Any]:
    from zeroloss.service import ZeroLossMessageService
    from zeroloss.snapshot import compute_snapshot

    service = ZeroLossMessageService(instance_id="bench-snapshot")
    snap_times = timed(lambda: compute_snapshot(service), runs)
    full_times = timed(lambda: conn.execute(FULL_GROUP_BY).fetchall(), runs)
    snap = compute_snapshot(service)
    exact = completed_count(conn)
    shown = snap.totals["completed"]
    estimated = bool(getattr(snap, "completed_estimated", False))
    plan = conn.execute(f"EXPLAIN {FULL_GROUP_BY}").fetchall()
    return {
        "size": size,
        "snapshot": snap_times,
        "full": full_times,
        "completed_exact": exact,
        "completed_shown": shown,
        "estimated": estimated,
        "full_plan": " / ".join(r[0].strip() for r in plan if "Scan" in r[0]),
        "live": {s: snap.totals[s] for s in ("pending", "processing", "dead")},
        "stuck": snap.stuck,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    database = BenchDatabase(server_url(args.server_url), args.db_name)
    reuse = False
    if args.reuse:
        try:
            with database.connect() as probe:
                reuse = probe.execute("SELECT to_regclass(%s) IS NOT NULL", [MSG]).fetchone()[0]
        except Exception:
            reuse = False
    if not reuse:
        database.create()
    for name in ("REDIS_URL", "CELERY_BROKER_URL"):
        os.environ.pop(name, None)
    os.environ["DATABASE_URL"] = database.url
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
    import django

    django.setup()
    from django.core.management import call_command

    results = []
    try:
        conn = database.connect()
        if not reuse:
            call_command("migrate", verbosity=0, interactive=False)
            began = time.perf_counter()
            load_live_set()
            _log(f"live set loaded through the service in {time.perf_counter() - began:.1f}s")
        for size in args.sizes:
            have = completed_count(conn)
            if have < size:
                load_completed(conn, have, size)
                began = time.perf_counter()
                conn.execute(f"VACUUM (ANALYZE) {MSG}")
                _log(f"VACUUM ANALYZE in {time.perf_counter() - began:.1f}s")
            elif have > size:
                _log(f"the database already holds {have:,} completed rows (> {size:,}); measuring those")
            results.append(measure(conn, max(have, size), args.runs))
            r = results[-1]
            _log(f"{r['size']:,} completed: snapshot {fmt(r['snapshot'])}, full GROUP BY {fmt(r['full'])}")
        conn.close()
    finally:
        if not args.keep_db:
            from django.db import connections

            connections.close_all()
            database.drop()

    print(f"snapshot cost, {args.runs} warm runs each (median, min-max); live set: {results[0]['live']}")
    for r in results:
        label = f"{r['size']:>12,} completed"
        print(f"{label}  compute_snapshot      {fmt(r['snapshot'])}")
        print(f"{'':>22}  full GROUP BY (before) {fmt(r['full'])}   plan: {r['full_plan']}")
        error = r["completed_shown"] - r["completed_exact"]
        print(
            f"{'':>22}  completed shown {r['completed_shown']:,} "
            f"({'estimate' if r['estimated'] else 'exact'}; exact {r['completed_exact']:,}, "
            f"off by {error:+,} = {100 * error / max(r['completed_exact'], 1):+.2f}%), stuck {r['stuck']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
