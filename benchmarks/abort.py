"""Abort latency: from an operator's abort to the running handler seeing it, on both databases.

``python -m benchmarks.abort [--rounds N] [--server-url URL] [--only postgresql|sqlite]`` (or
``python -m benchmarks --only abort``, which runs the same with the suite's sizes).

For each database (a fresh PostgreSQL database ``zeroloss_bench_abort`` on the server, dropped
at the end, and a temporary SQLite file), one real ``zeroloss_worker`` runs the demo handler
``demo.abortable``: it loops on ``delivery.abort_requested`` every 10 ms and writes, with its
own clock, when it saw the abort. Each round sends one message, waits for its handler to
start, lets it run 0.3 s, and calls ``zeroloss.cancel(id, abort=True)``. Two figures per round:

- **seen**: the handler's time of seeing the abort minus ``abort_requested_at`` (the database
  clock when the request's statement ran, before it committed: an upper bound of the latency
  from the commit). The promise: under 1 s.
- **recorded**: the ``aborted`` audit row's time minus ``abort_requested_at``: until the
  message is ``cancelled`` in the ledger (the handler returns at once here).

The worker renews its leases every 5 s (``HEARTBEAT_INTERVAL``): the baseline an abort
delivered only with the lease renewal would have (uniform over the interval: 2.5 s on
average, 5 s at worst). The keeper's poll (``ABORT_POLL_INTERVAL``, 0.25 s) decides instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import db

ROOT = Path(__file__).resolve().parent.parent
DB_NAME = "zeroloss_bench_abort"
HEARTBEAT = 5.0


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


def child(url: str, rounds: int) -> dict[str, Any]:
    """In a process of its own (one Django setup per database): the rounds, their figures."""
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
    settings_json = json.dumps({"HEARTBEAT_INTERVAL": HEARTBEAT, "ACK_TIMEOUT": 60})
    import django

    django.setup()
    from django.core.management import call_command

    import zeroloss
    from zeroloss.ledger.models import Message, MessageEvent
    from zeroloss.ledger.service import ZeroLossMessageService

    call_command("migrate", verbosity=0, interactive=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ZEROLOSS_SETTINGS_JSON": settings_json}
    worker = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "zeroloss_worker",
            "--queue",
            "demo.abortable",
            "--poll-interval",
            "0.05",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seen: list[float] = []
    recorded: list[float] = []
    service = ZeroLossMessageService()
    try:
        with tempfile.TemporaryDirectory(prefix="zeroloss-abort-") as work:
            for i in range(rounds):
                out = Path(work) / f"r{i}.json"
                mid = f"abort-{i}"
                service.persist_message(mid, "demo.abortable", {"out": str(out), "limit": 60})
                _wait(lambda out=out: Path(f"{out}.started").exists(), 120, "the handler to start")
                time.sleep(0.3)
                zeroloss.cancel(mid, abort=True, actor="bench")
                _wait(out.exists, 60, "the handler to see the abort")
                _wait(
                    lambda mid=mid: MessageEvent.objects.filter(
                        message__message_id=mid, reason="aborted"
                    ).exists(),
                    60,
                    "the cancelled outcome",
                )
                requested = Message.objects.get(message_id=mid).abort_requested_at
                assert requested is not None
                event = MessageEvent.objects.get(message__message_id=mid, reason="aborted")
                seen.append(json.loads(out.read_text())["seen"] - requested.timestamp())
                recorded.append((event.created_at - requested).total_seconds())
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    return {"seen": seen, "recorded": recorded}


def _figures(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": statistics.median(ordered),
        "p95": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
        "max": ordered[-1],
    }


def run(rounds: int, server: str | None = None, only: str | None = None) -> dict[str, Any]:
    results: dict[str, Any] = {}
    targets: list[tuple[str, str, db.BenchDatabase | None]] = []
    if only in (None, "postgresql"):
        fresh = db.BenchDatabase(db.server_url(server), DB_NAME)
        fresh.create()
        targets.append(("postgresql", fresh.url, fresh))
    work = tempfile.TemporaryDirectory(prefix="zeroloss-abort-sqlite-")
    if only in (None, "sqlite"):
        targets.append(("sqlite", f"sqlite:///{work.name}/abort.sqlite3", None))
    try:
        for vendor, url, _ in targets:
            proc = subprocess.run(
                [sys.executable, "-m", "benchmarks.abort", "--child", url, str(rounds)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60 + rounds * 30,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"{vendor}: {proc.stderr[-2000:]}")
            raw = json.loads(proc.stdout.strip().splitlines()[-1])
            results[vendor] = {name: _figures(values) for name, values in raw.items()}
            results[vendor]["rounds"] = rounds
    finally:
        for _, _, database in targets:
            if database is not None:
                database.drop()
        work.cleanup()
    return results


def report(results: dict[str, Any]) -> str:
    lines = [
        "| database | rounds | seen p50 | seen p95 | seen max | recorded p50 | recorded max | renewal baseline |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for vendor, r in results.items():
        seen, rec = r["seen"], r["recorded"]
        lines.append(
            f"| {vendor} | {r['rounds']} | {seen['p50'] * 1000:.0f} ms | {seen['p95'] * 1000:.0f} ms | "
            f"{seen['max'] * 1000:.0f} ms | {rec['p50'] * 1000:.0f} ms | {rec['max'] * 1000:.0f} ms | "
            f"{HEARTBEAT / 2:.1f} s avg, {HEARTBEAT:.0f} s max |"
        )
    return "\n".join(lines)


def run_in_suite(suite: Any) -> None:
    """``python -m benchmarks --only abort``: printed after the table."""
    rounds = 5 if suite.sizes.sigkill_runs == 1 else 20  # the quick profile's sizes
    print("\nabort latency:\n" + report(run(rounds)), flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(child(argv[1], int(argv[2]))))
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.abort",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=20, help="Aborts per database.")
    parser.add_argument("--server-url", help="Any database URL on the PostgreSQL server to use.")
    parser.add_argument("--only", choices=["postgresql", "sqlite"])
    args = parser.parse_args(argv)
    started = time.monotonic()
    print(report(run(args.rounds, args.server_url, args.only)))
    print(f"total {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
