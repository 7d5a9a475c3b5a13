"""WAL written per message over its whole life: send, claim, acknowledgement (with their audit
rows) and purge, on today's layout.

``python -m benchmarks.wal_life [--messages N]`` (or ``python -m benchmarks --only wal_life``)

Everything runs on a private PostgreSQL server started for the run (as benchmarks/retention.py
does), so ``pg_current_wal_lsn()`` before and after each phase counts this benchmark's WAL alone;
autovacuum is off there so that it writes nothing in between, and its cost is measured as a
phase of its own (``VACUUM`` of the tables the purge left, what autovacuum would do later). A
``CHECKPOINT`` precedes the run: the first change of each page after a checkpoint writes the
whole page (``full_page_writes``), which a real server pays once per checkpoint interval.

The phases, each by zeroloss's own code in a child process:

- **send, one per transaction**: ``zeroloss.send()`` in its own ``transaction.atomic()`` (how a
  view sends), for half of the messages;
- **send, batches of 100**: ``zeroloss.send_many()``, the other half;
- **drain**: ``zeroloss_worker --burst`` with a no-op handler (the batched claim and fenced
  outcome path, audit rows included);
- **purge**: ``zeroloss_purge --older-than 1s`` (batches of 1,000: audit rows, messages, a
  ``PurgeRecord`` each);
- **vacuum**: ``VACUUM`` of the message and audit tables after the purge.

The partitioned layout (issue 31) is not built yet; docs/scaling.md's scratch measurement is
the estimate for it until it is.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import psycopg

from .retention import manage, migrate, private_server, wal_bytes, wal_lsn

QUEUE = "bench.noop"
SEND_ONE = """
from django.db import transaction
import zeroloss
for i in range({count}):
    with transaction.atomic():
        zeroloss.send({queue!r}, {{"n": i}})
"""
SEND_MANY = """
import zeroloss
for start in range(0, {count}, 100):
    zeroloss.send_many({queue!r}, [{{"n": i}} for i in range(start, min(start + 100, {count}))])
"""


def count(conn: psycopg.Connection[Any], sql: str) -> int:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def run(messages: int) -> dict[str, Any]:
    half = messages // 2
    phases: list[dict[str, Any]] = []
    # autovacuum off: its WAL would land in whichever phase it ran
    with private_server("zeroloss_wal", max_wal_size="4GB", autovacuum="off") as url:
        migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")

            def phase(name: str, per: int, action: Any) -> None:
                start, t0 = wal_lsn(conn), time.perf_counter()
                action()
                seconds, written = time.perf_counter() - t0, wal_bytes(conn, start, wal_lsn(conn))
                phases.append({"phase": name, "messages": per, "wal": written, "seconds": seconds})
                print(
                    f"  . {name}: {written / per:,.0f} B a message, {seconds:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )

            phase(
                "send, one per transaction",
                half,
                lambda: manage(url, "shell", "-c", SEND_ONE.format(count=half, queue=QUEUE)),
            )
            phase(
                "send, batches of 100",
                messages - half,
                lambda: manage(url, "shell", "-c", SEND_MANY.format(count=messages - half, queue=QUEUE)),
            )
            phase(
                "drain (claim + acknowledge)",
                messages,
                lambda: manage(url, "zeroloss_worker", "--queue", QUEUE, "--burst"),
            )
            completed = count(conn, "SELECT count(*) FROM zeroloss_message WHERE status = 'completed'")
            if completed != messages:
                raise RuntimeError(f"the drain completed {completed} of {messages} messages")
            audit = count(conn, "SELECT count(*) FROM zeroloss_messageevent")
            time.sleep(1.1)  # the purge takes what completed over a second ago: all of it
            phase("purge", messages, lambda: manage(url, "zeroloss_purge", "--older-than", "1s", "--yes"))
            left = count(conn, "SELECT count(*) FROM zeroloss_message")
            if left:
                raise RuntimeError(f"the purge left {left} messages")
            phase(
                "vacuum after the purge",
                messages,
                lambda: conn.execute("VACUUM zeroloss_message, zeroloss_messageevent"),
            )
    return {"messages": messages, "audit_rows": audit, "phases": phases}


def report(result: dict[str, Any]) -> str:
    lines = [
        f"WAL per message over its life, today's layout ({result['messages']:,} messages, "
        f"{result['audit_rows']:,} audit rows before the purge)",
        "",
        "| phase | WAL a message | time |",
        "| --- | --- | --- |",
    ]
    life = 0.0
    for p in result["phases"]:
        per = p["wal"] / p["messages"]
        lines.append(f"| {p['phase']} | {per:,.0f} B | {p['seconds']:.1f} s |")
        if not p["phase"].startswith("send"):
            life += per
    sends = {p["phase"]: p["wal"] / p["messages"] for p in result["phases"] if p["phase"].startswith("send")}
    for name, per in sends.items():
        lines.append(f"| **whole life, {name}** | **{per + life:,.0f} B** | |")
    return "\n".join(lines)


def run_in_suite(suite: Any) -> None:
    """``python -m benchmarks --only wal_life``: 20,000 messages, the report after the table."""
    print("\nwal_life:\n" + report(run(20_000)), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args(argv)
    if args.messages < 200:
        parser.error("--messages must be at least 200")
    print(report(run(args.messages)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
