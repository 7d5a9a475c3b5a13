"""WAL written per message over its whole life: send, claim, acknowledgement (with their audit
rows) and purge, on both layouts: a 0.2 ledger upgraded (unpartitioned) and a new install's
(partitioned by day).

``python -m benchmarks.wal_life [--messages N] [--layout unpartitioned|partitioned|both]`` (or
``python -m benchmarks --only wal_life``)

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
- **purge**: unpartitioned, ``zeroloss_purge --older-than 1s`` (batches of 1,000: audit rows,
  messages, a ``PurgeRecord`` each); partitioned, the purge's own period drop
  (``_drop_expired_periods``) with its cut-off two days ahead, so that today's period is past
  retention: detach, count, key deletes, ``PurgeRecord`` rows, ``DROP``;
- **vacuum**: ``VACUUM`` of the message and audit tables after the purge.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import psycopg

from .retention import manage, migrate, migrate_unpartitioned, private_server, wal_bytes, wal_lsn

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


#: The partitioned layout's purge: the period the messages were sent in detached and dropped by
#: the purge's own code (``_drop_expired_periods``), with a cut-off two days ahead so that
#: today's period counts as past retention (nothing else is changed to get there).
DROP_TODAY = """
from zeroloss.ledger.service import ZeroLossMessageService
dropped = ZeroLossMessageService(instance_id="wal-life").operator._drop_expired_periods(-2 * 86400, "wal-life")
assert dropped == {count}, dropped
"""


def run(messages: int, layout: str = "unpartitioned") -> dict[str, Any]:
    half = messages // 2
    phases: list[dict[str, Any]] = []
    # autovacuum off: its WAL would land in whichever phase it ran
    with private_server("zeroloss_wal", max_wal_size="4GB", autovacuum="off") as url:
        if layout == "partitioned":
            migrate(url)
        else:
            migrate_unpartitioned(url)
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
            seeded = 1 if layout == "unpartitioned" else 0  # migrate_unpartitioned's one message
            completed = count(conn, "SELECT count(*) FROM zeroloss_message WHERE status = 'completed'")
            if completed != messages + seeded:
                raise RuntimeError(f"the drain completed {completed - seeded} of {messages} messages")
            audit = count(conn, "SELECT count(*) FROM zeroloss_messageevent")
            time.sleep(1.1)  # the purge takes what completed over a second ago: all of it
            if layout == "partitioned":
                drop = DROP_TODAY.format(count=messages)
                phase("purge (the period dropped)", messages, lambda: manage(url, "shell", "-c", drop))
            else:
                phase("purge", messages, lambda: manage(url, "zeroloss_purge", "--older-than", "1s", "--yes"))
            left = count(conn, "SELECT count(*) FROM zeroloss_message")
            if left:
                raise RuntimeError(f"the purge left {left} messages")
            phase(
                "vacuum after the purge",
                messages,
                lambda: conn.execute("VACUUM zeroloss_message, zeroloss_messageevent"),
            )
    return {"messages": messages, "audit_rows": audit, "phases": phases, "layout": layout}


def report(result: dict[str, Any]) -> str:
    lines = [
        f"WAL per message over its life, {result.get('layout', 'unpartitioned')} layout ({result['messages']:,} messages, "
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
    for layout in ("unpartitioned", "partitioned"):
        print(f"\nwal_life ({layout}):\n" + report(run(20_000, layout)), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument(
        "--layout",
        choices=["unpartitioned", "partitioned", "both"],
        default="both",
        help="unpartitioned: a 0.2 ledger upgraded; partitioned: a new install's (default: both).",
    )
    args = parser.parse_args(argv)
    if args.messages < 200:
        parser.error("--messages must be at least 200")
    for layout in ("unpartitioned", "partitioned") if args.layout == "both" else (args.layout,):
        print(report(run(args.messages, layout)) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
