"""The test command (``make test`` runs ``python -m tests.suite``).

1. static checks: ruff, mypy, ``makemigrations --check``, ``manage.py check``;
2. the pytest suite against PostgreSQL (every test);
3. the pytest suite against SQLite, the embedded default (every test not marked
   ``postgres_only``: those use PostgreSQL-only features such as streaming replication).

PostgreSQL comes from ``ZEROLOSS_TEST_POSTGRES_URL`` (default
``postgres://postgres@127.0.0.1:5432/zeroloss``; the test database is ``test_<name>``).
Services the tests need are checked first; a missing one is a clear failure, never a skip.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/zeroloss"
DEFAULT_REDIS = "redis://127.0.0.1:6379/15"


def _reachable(url: str, default_port: int) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection(
            (parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout=3
        ):
            return True
    except OSError:
        return False


def _run(title: str, cmd: list[str], env: dict[str, str] | None = None) -> bool:
    print(f"\n=== {title}: {' '.join(cmd)}", flush=True)
    started = time.monotonic()
    ok = subprocess.call(cmd, cwd=ROOT, env=env) == 0
    print(f"=== {title}: {'ok' if ok else 'FAILED'} ({time.monotonic() - started:.0f}s)", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lint-only", action="store_true")
    parser.add_argument("--skip-lint", action="store_true")
    parser.add_argument("--only", choices=["postgres", "sqlite"], help="Run one database pass.")
    parser.add_argument("pytest_args", nargs="*", help="Extra pytest arguments (e.g. -k sweep).")
    args = parser.parse_args()

    py = sys.executable
    results: dict[str, bool] = {}
    base_env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    base_env["PYTHONPATH"] = str(ROOT)
    base_env.setdefault("ZEROLOSS_TEST_REDIS_URL", DEFAULT_REDIS)

    if not args.skip_lint:
        results["ruff"] = _run("ruff", [py, "-m", "ruff", "check", "."], base_env)
        results["ruff format"] = _run("ruff format", [py, "-m", "ruff", "format", "--check", "."], base_env)
        results["mypy"] = _run("mypy", [py, "-m", "mypy", "zeroloss"], base_env)
        results["migrations"] = _run(
            "migrations", [py, "manage.py", "makemigrations", "--check", "--dry-run"], base_env
        )
        results["check"] = _run(
            "django check", [py, "manage.py", "check", "--fail-level", "WARNING"], base_env
        )
    if args.lint_only:
        return _summary(results)

    pg_url = os.environ.get("ZEROLOSS_TEST_POSTGRES_URL", DEFAULT_PG)
    redis_url = base_env["ZEROLOSS_TEST_REDIS_URL"]
    missing = []
    if args.only != "sqlite" and not _reachable(pg_url, 5432):
        missing.append(f"PostgreSQL at {pg_url} (set ZEROLOSS_TEST_POSTGRES_URL)")
    if not _reachable(redis_url, 6379):
        missing.append(f"Redis at {redis_url} (set ZEROLOSS_TEST_REDIS_URL)")
    if missing:
        print(
            "The test suite needs these services and could not reach them:\n  " + "\n  ".join(missing),
            flush=True,
        )
        return 2

    pytest = [py, "-m", "pytest", *args.pytest_args]
    if args.only != "sqlite":
        env = dict(base_env, DATABASE_URL=pg_url)
        results["pytest postgres"] = _run("pytest (PostgreSQL)", pytest, env)
    if args.only != "postgres":
        env = dict(base_env)
        env.setdefault("ZEROLOSS_VAR_DIR", str(ROOT / "var" / "test-sqlite"))
        results["pytest sqlite"] = _run("pytest (SQLite)", [*pytest, "-m", "not postgres_only"], env)
    return _summary(results)


def _summary(results: dict[str, bool]) -> int:
    print("\n=== summary")
    for name, ok in results.items():
        print(f"  {'ok    ' if ok else 'FAILED'} {name}")
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
