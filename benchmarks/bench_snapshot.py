"""What one ledger snapshot costs as completed history grows (issue 17.8).

    git show c635315:zeroloss/snapshot.py > /tmp/snapshot_before.py   # the snapshot before issue 17.8
    python -m benchmarks.bench_snapshot --before /tmp/snapshot_before.py [--sizes 1000000 10000000]
                                        [--runs 7] [--keep-db] [--reuse]

Creates its own PostgreSQL database (``--db-name``, default ``zeroloss_bench_snapshot``) on the
server of ``--server-url`` / ``ZEROLOSS_BENCH_POSTGRES_URL`` / ``ZEROLOSS_TEST_POSTGRES_URL``,
migrates it and loads a live working set through the service: 10,000 pending messages in
four queues (a quarter of them delayed), 200 processing (50 with an expired lease), 1,000
dead letters and a few sweep recoveries. Then, for each size in ``--sizes`` (ascending), it
bulk-loads completed messages with ``INSERT ... SELECT generate_series`` until that many are
retained, runs ``VACUUM ANALYZE`` (what autovacuum does in production) and times, warm:

- ``compute_snapshot``: :func:`zeroloss.ops.snapshot.compute_snapshot` of the checked-out code
  (the uncached read every metrics/health/status cache miss pays);
- ``before``: ``compute_snapshot`` of the older ``snapshot.py`` given with ``--before`` (loaded
  as ``zeroloss._snapshot_before``, so it runs against the same models and service);
- ``full GROUP BY``: ``SELECT queue_name, status, count(*) ... GROUP BY 1, 2`` over the whole
  table, the statement at the heart of the old snapshot, as a raw-SQL reference.

The three are timed in interleaved runs, so machine noise hits them alike.

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
    parser.add_argument(
        "--before",
        type=Path,
        metavar="FILE",
        help="An older snapshot module (zeroloss/ops/snapshot.py; zeroloss/snapshot.py before 0.3) to time next to this one.",
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
    from zeroloss.ledger.models import Message
    from zeroloss.ledger.service import ZeroLossMessageService

    service = ZeroLossMessageService(instance_id="bench-live")
    # First a few sweep recoveries, so the audit-trail part of the snapshot has something to count.
    service.persist_messages([(f"recovered-{i}", "orders", {"i": i}) for i in range(100)])
    assert len(service.claim("orders", limit=100)) == 100
    Message.objects.filter(message_id__startswith="recovered-").update(
        lease_expires_at="2000-01-01T00:00:00Z"
    )
    assert ZeroLossMessageService(instance_id="bench-sweeper").sweep().total == 100
    for n, queue in enumerate(QUEUES):
        # Claims take the oldest message first: dead letters before the rest of the queue.
        service.persist_messages([(f"dead-{queue}-{i}", queue, {"i": i}) for i in range(250)], max_attempts=1)
        for lease in service.claim(queue, limit=350 if n == 0 else 250):
            if lease.message_id.startswith("dead-"):
                assert service.fail(lease.message_id, lease.token, "bench: failed on purpose")
            else:
                assert service.release(lease.message_id, lease.token)
        service.persist_messages([(f"live-{queue}-{i}", queue, {"i": i}) for i in range(1_875)])
        service.persist_messages([(f"later-{queue}-{i}", queue, {"i": i}) for i in range(625)], delay=3600)
        leases = service.claim(queue, limit=50)
        assert len(leases) == 50, leases
        # This queue's leases expired (50 stuck messages); the others' stay live for the run.
        expires = "2000-01-01T00:00:00Z" if n == 0 else "2999-01-01T00:00:00Z"
        Message.objects.filter(message_id__in=[lease.message_id for lease in leases]).update(
            lease_expires_at=expires
        )


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
                "now() - interval '2 hours', 'bench-old-worker', '', '[]'::jsonb, "
                "now() - interval '2 hours', now() - interval '1 hour', now() - interval '1 hour' "
                "FROM generate_series(%s::bigint, %s::bigint) AS g",
                [lo + 1, hi],
            )
        _log(f"loaded completed rows {lo + 1:,}..{hi:,} in {time.perf_counter() - began:.1f}s")


def load_before(path: Path) -> Any:
    """An older snapshot module, importable next to the current one (same package, same models):
    in ``zeroloss.ops`` as the snapshot is now, or at the package's root as before 0.3 (whose
    relative imports go up one level, never two)."""
    import importlib.util

    package = "zeroloss.ops" if "from .." in path.read_text() else "zeroloss"
    spec = importlib.util.spec_from_file_location(f"{package}._snapshot_before", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def timed(fns: dict[str, Any], runs: int) -> dict[str, list[float]]:
    """Each function ``runs`` times, interleaved, after one warm-up call each."""
    values: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm: caches, plans, buffers
    for _ in range(runs):
        for name, fn in fns.items():
            began = time.perf_counter()
            fn()
            values[name].append(time.perf_counter() - began)
    return values


def fmt(values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):9.1f} ms  ({min(ms):.1f}-{max(ms):.1f})"


def measure(conn: Any, size: int, runs: int, before: Any) -> dict[str, Any]:
    from zeroloss.ledger.service import ZeroLossMessageService
    from zeroloss.ops.snapshot import compute_snapshot

    service = ZeroLossMessageService(instance_id="bench-snapshot")
    fns = {"snapshot": lambda: compute_snapshot(service)}
    if before is not None:
        fns["before"] = lambda: before.compute_snapshot(service)
    fns["full"] = lambda: conn.execute(FULL_GROUP_BY).fetchall()
    times = timed(fns, runs)
    snap = compute_snapshot(service)
    plan = conn.execute(f"EXPLAIN {FULL_GROUP_BY}").fetchall()
    return {
        "size": size,
        "times": times,
        "completed_exact": completed_count(conn),
        "completed_shown": snap.totals["completed"],
        "estimated": bool(getattr(snap, "completed_estimated", False)),
        "full_plan": " / ".join(r[0].strip().lstrip("-> ") for r in plan if "Scan" in r[0]),
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
                row = probe.execute("SELECT to_regclass(%s) IS NOT NULL", [MSG]).fetchone()
                reuse = row is not None and bool(row[0])
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
    before = load_before(args.before) if args.before else None
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
            results.append(measure(conn, max(have, size), args.runs, before))
            r = results[-1]
            _log(f"{r['size']:,} completed: " + ", ".join(f"{k} {fmt(v)}" for k, v in r["times"].items()))
        conn.close()
    finally:
        if not args.keep_db:
            from django.db import connections

            connections.close_all()
            database.drop()

    labels = {
        "snapshot": "compute_snapshot (this code)",
        "before": f"compute_snapshot ({args.before})",
        "full": "full GROUP BY (raw SQL)",
    }
    print(
        f"snapshot cost, {args.runs} warm interleaved runs each (median, min-max); live set: {results[0]['live']}"
    )
    for r in results:
        print(f"{r['size']:>12,} completed rows retained")
        for key, values in r["times"].items():
            print(f"    {labels[key]:<48} {fmt(values)}")
        error = r["completed_shown"] - r["completed_exact"]
        print(
            f"    completed shown {r['completed_shown']:,} ({'estimate' if r['estimated'] else 'exact'}; exact "
            f"{r['completed_exact']:,}, off by {error:+,} = {100 * error / max(r['completed_exact'], 1):+.2f}%), "
            f"stuck {r['stuck']}; full GROUP BY plan: {r['full_plan']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
