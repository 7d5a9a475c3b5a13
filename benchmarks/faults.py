"""The fault suite's soak: ``python -m benchmarks --only faults`` (or ``make chaos``).

Starts its own PostgreSQL cluster (and, for the Celery scenario, its own Redis), runs the
workload under a seeded schedule of faults (tests/faults), checks the whole history and prints
the table of docs/guarantees.md ("Faults, tested"). The ``partitions`` scenario (root: Linux
network namespaces) cuts a worker off and kills a cut-off worker's host, for a plain and a
transactional handler, in a cluster of its own (tests/faults/partitions.py), and prints the
table of docs/guarantees.md ("Partitions and dead hosts"). The ``storage`` scenario (root: loop
mounts, FUSE) fills the filesystem under PostgreSQL's data directory, then its pg_wal, stalls
pg_wal's fsyncs, fills SQLite's file's filesystem, and prints
the table of docs/guarantees.md ("Storage faults, tested"; tests/faults/storage.py). Exits 1 if any check failed or a
target was missed.

The ``workflows`` scenario (issue 47) sends a group with a transactional callback and a chain of
diamonds, then SIGKILLs a worker every few seconds and restarts PostgreSQL once while three
workers drain them (tests/faults/workflows.py), and prints the table of docs/guarantees.md
("Workflows under faults").

``python -m benchmarks.faults [--profile soak|ci] [--seed N] [--scenario database celery recovery workflows partitions storage]
[--storage disk-full wal-full fsync-stalls fsync-stall sqlite-full]``
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

SCENARIOS = ("database", "celery", "recovery", "workflows", "partitions", "storage")


def main(argv: list[str] | None = None, *, profile: str = "soak") -> int:
    import django

    # the fault suite's modules reach zeroloss's models (tests.faults.zeroloss_handlers)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from tests.faults.cluster import FaultCluster
    from tests.faults.partitions import report as partition_report
    from tests.faults.partitions import run_partitions
    from tests.faults.scenario import PROFILES, measure_recovery, report, run_celery, run_database
    from tests.faults.storage import RUNNERS as STORAGE_SCENARIOS
    from tests.faults.storage import report as storage_report
    from tests.faults.storage import run_scenarios as run_storage
    from tests.faults.workflows import WF_PROFILES, run_workflows
    from tests.faults.workflows import report as workflow_report

    parser = argparse.ArgumentParser(prog="python -m benchmarks.faults", description=__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default=profile)
    parser.add_argument("--seed", type=int, help="Replay a schedule (default: a new random seed, printed).")
    parser.add_argument("--scenario", nargs="+", choices=SCENARIOS, default=list(SCENARIOS))
    parser.add_argument("--keep", action="store_true", help="Keep the run directory (logs) even on success.")
    parser.add_argument(
        "--storage",
        nargs="+",
        choices=list(STORAGE_SCENARIOS),
        default=list(STORAGE_SCENARIOS),
        help="The storage scenarios to run (default: all five).",
    )
    args = parser.parse_args(argv)
    chosen = PROFILES[args.profile]
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    base = Path(tempfile.mkdtemp(prefix="zl-faults-"))
    load = os.getloadavg()
    print(
        f"fault suite: profile {chosen.name}, seed {seed} (replay: --seed {seed}), {os.cpu_count()} cores, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, logs in {base}",
        flush=True,
    )
    started = time.monotonic()
    results = []
    net_results = []
    storage_results = []
    workflow_results = []
    on_cluster = [name for name in args.scenario if name not in ("partitions", "storage")]
    if on_cluster:
        cluster = FaultCluster()
        try:
            cluster.start()
            runners = {"database": run_database, "celery": run_celery, "recovery": measure_recovery}
            for name in on_cluster:
                print(f"- {name} ...", flush=True)
                if name == "workflows":
                    workflow_results.append(
                        run_workflows(
                            cluster,
                            WF_PROFILES[chosen.name],
                            seed,
                            base,
                            lambda line: print(line, flush=True),
                        )
                    )
                    continue
                results.append(
                    runners[name](cluster, chosen, seed, base, lambda line: print(line, flush=True))
                )
        finally:
            cluster.stop()
    if "partitions" in args.scenario:
        print("- partitions ...", flush=True)
        net_results = run_partitions(chosen, seed, base, lambda line: print(line, flush=True))
    if "storage" in args.scenario:
        print("- storage ...", flush=True)
        storage_results = run_storage(args.storage, chosen, seed, base, lambda line: print(line, flush=True))
    ok = (
        all(r.ok for r in results)
        and not any(r.misses() for r in net_results)
        and all(r.ok for r in storage_results)
        and all(r.ok for r in workflow_results)
    )
    print()
    if results:
        print(report(results, profile=chosen, seed=seed))
    if workflow_results:
        print(f"\n{workflow_report(workflow_results)}")
    if net_results:
        print(f"\n{partition_report(net_results)}")
    if storage_results:
        print(f"\n{storage_report(storage_results)}")
    load = os.getloadavg()
    print(
        f"\ntotal {time.monotonic() - started:.0f}s, load average at end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; "
        f"{'all checks passed' if ok else 'CHECKS FAILED'}"
    )
    if ok and not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"logs kept in {base}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
