"""What "replicated" persistence costs against "durable", on a real primary + streaming standby.

    python -m benchmarks.bench_replication [--count 2000] [--batch 100]

Starts its own throwaway primary and standby (``tests/infra/pgcluster.py``: PostgreSQL 15 server
binaries, run as the ``postgres`` OS user when started as root, fsync on, loopback only),
migrates the primary, then persists messages one at a time and in batches with
``PERSISTENCE_LEVEL = "durable"`` and ``"replicated"`` (``REPLICATION_FACTOR = 2``), and
prints rate and latency for each. Everything is removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.infra.pgcluster import PgCluster  # noqa: E402


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=2000, help="Single-message persists per level.")
    parser.add_argument("--batch", type=int, default=100, help="Messages per persist_messages batch.")
    parser.add_argument("--batches", type=int, default=20, help="Batches per level.")
    args = parser.parse_args()

    cluster = PgCluster(standby_name="bench-standby")
    try:
        cluster.start()
        env = dict(os.environ, DATABASE_URL=cluster.url(), PYTHONPATH=str(ROOT))
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env, check=True
        )
        cluster.start_standby()
        os.environ["DATABASE_URL"] = cluster.url()
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
        import django

        django.setup()
        from zeroloss.ledger.service import ZeroLossMessageService

        print(
            f"PostgreSQL primary :{cluster.primary_port} + streaming standby :{cluster.standby_port} (fsync on)"
        )
        print(f"{'level':<11} {'mode':<15} {'msgs/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
        results: dict[tuple[str, str], float] = {}
        for level in ("durable", "replicated", "durable", "replicated"):  # interleaved: warm-up fairness
            service = ZeroLossMessageService(
                persistence_level=level, replication_factor=2, replication_timeout=10
            )
            tag = f"{level}-{time.monotonic_ns()}"
            lat: list[float] = []
            started = time.perf_counter()
            for i in range(args.count):
                t = time.perf_counter()
                service.persist_message(f"{tag}-{i}", "bench", {"n": i, "text": "x" * 200})
                lat.append(time.perf_counter() - t)
            single = args.count / (time.perf_counter() - started)
            blat: list[float] = []
            started = time.perf_counter()
            for b in range(args.batches):
                items = [(f"{tag}-b{b}-{i}", "bench", {"n": i, "text": "x" * 200}) for i in range(args.batch)]
                t = time.perf_counter()
                service.persist_messages(items)
                blat.append(time.perf_counter() - t)
            batched = args.batch * args.batches / (time.perf_counter() - started)
            results[(level, "single")] = single
            results[(level, "batch")] = batched
            print(
                f"{level:<11} {'single':<15} {single:>9.0f} {statistics.median(lat) * 1000:>8.2f} "
                f"{_pct(lat, 0.99) * 1000:>8.2f}"
            )
            print(
                f"{level:<11} {f'batch of {args.batch}':<15} {batched:>9.0f} "
                f"{statistics.median(blat) * 1000:>8.2f} {_pct(blat, 0.99) * 1000:>8.2f}"
            )
        for mode in ("single", "batch"):
            ratio = results[("replicated", mode)] / results[("durable", mode)]
            print(f"replicated/durable throughput, {mode}: {ratio:.2f}x (last round)")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
