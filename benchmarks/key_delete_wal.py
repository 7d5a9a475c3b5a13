"""The WAL floor of a dropped day's key deletes (issue 31, docs/scaling.md).

``python -m benchmarks.key_delete_wal [--rows N] [--batch N]``

A partition drop writes almost no WAL, but the day's ids must then leave the unpartitioned key
table (``zeroloss_message_key``) one row each. This measures what such deletes cost at the
least, on a private PostgreSQL server: ``--rows`` rows in a table shaped like the key table
(``message_id varchar(255)`` primary key, ``created_at``), deleted ``--batch`` a transaction in
the order of a companion table's ids (as ``partition_drops.delete_dropped_keys`` deletes them in the
order of the detached partition's ids), then ``pg_waldump --stats=record`` over exactly that WAL.
The ``Heap/DELETE`` records' own bytes are what no cut of the deletes avoids; the full-page
images on top depend on the checkpoints and on how the ids lie in the table.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from typing import Any

import psycopg

from .retention import private_server, wal_bytes, wal_lsn


def waldump_stats(waldir: str, start: str, end: str) -> dict[str, dict[str, int]]:
    """``pg_waldump --stats=record`` between two LSNs: per record type, its count, record bytes
    and full-page image bytes. Called inside ``private_server``, which put the checkout on the path."""
    from tests.infra.pgcluster import find_bin

    out = subprocess.run(
        [str(find_bin() / "pg_waldump"), "-p", waldir, "-s", start, "-e", end, "--stats=record"],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    stats = {}
    for line in out.splitlines():
        # "Heap/DELETE   1000000 ( 99.06)   54046730 ( 95.61)   76224304 (100.00)   130271034 ( 98.13)"
        found = re.match(r"^(\S+/\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)", line)
        if found:
            stats[found[1]] = {
                "count": int(found[2]),
                "record_bytes": int(found[3]),
                "fpi_bytes": int(found[4]),
            }
    return stats


def run(rows: int, batch: int) -> dict[str, Any]:
    with private_server("zeroloss_key_wal") as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE k (message_id varchar(255) PRIMARY KEY, created_at timestamptz NOT NULL)")
        conn.execute(
            "INSERT INTO k SELECT gen_random_uuid()::text, now() - interval '10 days' + g * interval '1 ms' "
            "FROM generate_series(1, %s) g",
            [rows],
        )
        conn.execute(
            "CREATE TABLE d AS SELECT row_number() OVER (ORDER BY created_at) AS id, message_id FROM k"
        )
        conn.execute("CREATE INDEX ON d (id)")
        conn.execute("VACUUM ANALYZE k")
        conn.execute("VACUUM ANALYZE d")
        conn.execute("CHECKPOINT")
        start = wal_lsn(conn)
        deleted = 0
        for low in range(0, rows, batch):
            cur = conn.execute(
                "DELETE FROM k USING d WHERE k.message_id = d.message_id AND d.id > %s AND d.id <= %s",
                [low, low + batch],
            )
            deleted += cur.rowcount
        end = wal_lsn(conn)
        row = conn.execute("SELECT current_setting('data_directory')").fetchone()
        assert row is not None
        stats = waldump_stats(f"{row[0]}/pg_wal", start, end)
        return {"rows": rows, "deleted": deleted, "wal_bytes": wal_bytes(conn, start, end), "stats": stats}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.key_delete_wal", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="Keys to delete.")
    parser.add_argument("--batch", type=int, default=5_000, help="Deletes a transaction.")
    args = parser.parse_args(argv)
    result = run(args.rows, args.batch)
    delete = result["stats"].get("Heap/DELETE", {"count": 0, "record_bytes": 0, "fpi_bytes": 0})
    print(
        f"{result['deleted']:,} keys deleted, {args.batch:,} a transaction: WAL {result['wal_bytes']:,} B; "
        f"Heap/DELETE records {delete['count']:,}, {delete['record_bytes']:,} B of records "
        f"({delete['record_bytes'] / max(delete['count'], 1):.1f} B each) + {delete['fpi_bytes']:,} B of full-page images"
    )
    for name, s in sorted(
        result["stats"].items(), key=lambda kv: -kv[1]["record_bytes"] - kv[1]["fpi_bytes"]
    ):
        print(
            f"  {name}: {s['count']:,} records, {s['record_bytes']:,} B + {s['fpi_bytes']:,} B of page images"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
