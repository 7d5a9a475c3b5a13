"""``--profile DIR``: py-spy profiles of the two hot paths (persist, worker drain)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import db, profile


def run_profiles(suite: Any, outdir: Path) -> None:
    if profile.available() is None:
        print("\nprofiles skipped: py-spy is not installed (pip install py-spy)")
        return
    outdir.mkdir(parents=True, exist_ok=True)
    n = max(suite.sizes.insert, 3000)
    service = suite.service()
    db.reset(suite.conn)

    def persist() -> None:
        prefix = suite.prefix("prof")
        for i in range(n):
            service.persist_message(f"{prefix}-{i}", "bench.persist", {"n": i})

    persist_out = outdir / "persist.collapsed.txt"
    profile.record(os.getpid(), persist_out, persist)
    print(f"\nprofile: persist_message x {n}, this process ({persist_out})")
    print(profile.top_frames(persist_out))

    db.reset(suite.conn)
    workers = suite.start_workers(1)
    drain_out = outdir / "worker-drain.collapsed.txt"
    count = suite.sizes.drain
    try:

        def drain() -> None:
            suite.load_pending("bench.noop", count)
            suite.wait_drained("bench.noop", count)

        profile.record(workers[0].pid, drain_out, drain)
    finally:
        for w in workers:
            w.stop()
    print(f"\nprofile: zeroloss_worker draining {count:,} no-op messages, 1 process ({drain_out})")
    print(profile.top_frames(drain_out))
    db.reset(suite.conn)
