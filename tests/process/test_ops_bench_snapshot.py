"""``python -m benchmarks.bench_snapshot`` runs end to end (tiny sizes); it checks no time."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.conftest import ROOT

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow, pytest.mark.once]


def test_snapshot_benchmark_runs_and_compares_with_an_older_snapshot(tmp_path: Path) -> None:
    assert connection.vendor == "postgresql", "the benchmark measures PostgreSQL: run the PostgreSQL pass"
    s = connection.settings_dict
    server = f"postgres://{s.get('USER') or 'postgres'}@{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/postgres"
    db_name = f"{s['NAME']}_bench_snapshot"  # next to this pass's test database, never shared
    before = tmp_path / "snapshot_before.py"
    before.write_text((ROOT / "zeroloss" / "ops" / "snapshot.py").read_text())  # any snapshot module will do
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env["PYTHONPATH"] = str(ROOT)
    args = ["--sizes", "1000", "3000", "--runs", "2", "--before", str(before)]
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.bench_snapshot",
                *args,
                "--server-url",
                server,
                "--db-name",
                db_name,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^\s+1,000 completed rows retained$", out, re.M), out
    assert re.search(r"^\s+3,000 completed rows retained$", out, re.M), out
    assert out.count("compute_snapshot (this code)") == 2
    assert out.count(f"compute_snapshot ({before})") == 2
    assert out.count("full GROUP BY (raw SQL)") == 2
    # Small tables are counted, so the shown count is the exact one.
    assert "completed shown 3,000 (exact; exact 3,000, off by +0" in out
    assert "live set: {'pending': 9900, 'processing': 200, 'dead': 1000}" in out
