"""The test command (``make test`` runs ``python -m tests.suite``).

1. static checks: ruff, mypy (over ``zeroloss``, ``tests`` and ``benchmarks``),
   ``makemigrations --check``, ``manage.py check``;
2. the pytest suite against PostgreSQL (every test);
3. the pytest suite against SQLite, the embedded default (every test not marked
   ``postgres_only``: those use PostgreSQL-only features such as streaming replication; tests
   marked ``sqlite_only`` are about SQLite itself and run only in this pass).

Pass 2 is three shards (``tests/shards.py``; ``--postgres-shards 1`` makes it one pass, and so do
test paths given as arguments). The shards and pass 3 run side by side (``--serial``: one after
the other), each with its own database (shard N > 1: the name with N appended), var dir
(``var/test-postgres``, ``var/test-postgres-N``, ``var/test-sqlite``), range of loopback ports
(``ZEROLOSS_TEST_PORTS``) and Redis database: shard 1 ``ZEROLOSS_TEST_REDIS_URL``'s, the SQLite
pass ``ZEROLOSS_TEST_REDIS_URL_SQLITE``'s, shard N ``ZEROLOSS_TEST_REDIS_URL_SHARD<N>``'s, by
default the next free ones below the first (``/15`` -> ``/14``, ``/13``, ``/12``).

``--skip-once`` leaves out the tests marked ``once``: every test outside the tiers whose outcome
can depend on the Django version (``tests/conftest.py``'s ``DJANGO_TIERS``: unit, ledger,
browser), such as worker processes, PostgreSQL's own machinery under faults and the docs. CI
runs them in its first pass only.

``--fast`` (``make test-fast``) is the inner loop: the unit and ledger tiers on SQLite in
memory, no OS process, no lint, with its wall time printed at the end.

PostgreSQL comes from ``ZEROLOSS_TEST_POSTGRES_URL`` (default
``postgres://postgres@127.0.0.1:5432/zeroloss``; the test database is ``test_<name>``) and
Redis from ``ZEROLOSS_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/15``). When a default
is not reachable, the suite starts a private server for the run, on a free loopback port:
PostgreSQL from the machine's server binaries or, failing those, from the ``pgserver`` wheel
(installed into the virtual environment on demand); Redis from ``redis-server`` on the PATH.
A URL you set explicitly is never replaced. A service that can be neither reached nor
started is a clear failure (exit code 2), never a skip.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tests import shards

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/zeroloss"
DEFAULT_REDIS = "redis://127.0.0.1:6379/15"
STARTED = time.monotonic()
FAILURES: list[str] = []  # the FAILED/ERROR lines of pytest's short summaries


def _reachable(url: str, default_port: int) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection(
            (parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout=3
        ):
            return True
    except OSError:
        return False


class PrivateServices:
    """Servers this run started itself; stopped when it ends."""

    def __init__(self) -> None:
        self.postgres: Any = None
        self.redis: subprocess.Popen[bytes] | None = None
        self.redis_dir: str | None = None

    def start_postgres(self) -> str:
        try:
            from tests.infra.pgcluster import ClusterError, PgCluster
        except ImportError as exc:  # psycopg missing: the install step failed
            raise RuntimeError(f"cannot start a private PostgreSQL: {exc}") from exc
        try:
            cluster = PgCluster(dbname="zeroloss", max_connections=200)
        except ClusterError:
            # No server binaries on this machine: the pgserver wheel carries them.
            print("=== no PostgreSQL server binaries here; installing the pgserver wheel", flush=True)
            if subprocess.call([sys.executable, "-m", "pip", "install", "--quiet", "pgserver"]) != 0:
                raise RuntimeError("pip install pgserver failed") from None
            import importlib

            import tests.infra.pgcluster as pgcluster

            importlib.reload(pgcluster)
            cluster = pgcluster.PgCluster(dbname="zeroloss", max_connections=200)
        try:
            cluster.start()
        except ClusterError as exc:
            cluster.stop()
            raise RuntimeError(str(exc)) from exc
        self.postgres = cluster
        url = cluster.url()
        print(f"=== started a private PostgreSQL for this run: {url}", flush=True)
        return url

    def start_redis(self) -> str:
        import shutil
        import tempfile

        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)")
        from tests.infra.pgcluster import free_port
        from tests.support.waiting import wait_until

        port = free_port()
        self.redis_dir = tempfile.mkdtemp(prefix="zl-redis-")
        self.redis = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.redis_dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"redis://127.0.0.1:{port}/15"
        redis = self.redis

        def accepting() -> bool:
            if redis.poll() is not None:
                raise RuntimeError(f"the private redis-server exited ({redis.returncode})")
            return _reachable(url, port)

        if not wait_until(accepting, 20, interval=0.1):
            raise RuntimeError("the private redis-server did not start in 20 s")
        print(f"=== started a private Redis for this run: {url}", flush=True)
        return url

    def stop(self) -> None:
        if self.postgres is not None:
            self.postgres.stop()
        if self.redis is not None:
            self.redis.terminate()
            self.redis.wait(timeout=10)
        if self.redis_dir:
            import shutil

            shutil.rmtree(self.redis_dir, ignore_errors=True)


def _run(title: str, cmd: list[str], env: dict[str, str] | None = None) -> bool:
    print(f"\n=== {title}: {' '.join(cmd)}", flush=True)
    started = time.monotonic()
    ok = _passed(title, subprocess.call(cmd, cwd=ROOT, env=env))
    print(f"=== {title}: {'ok' if ok else 'FAILED'} ({time.monotonic() - started:.0f}s)", flush=True)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lint-only", action="store_true")
    parser.add_argument("--skip-lint", action="store_true")
    parser.add_argument("--only", choices=["postgres", "sqlite"], help="Run one database pass.")
    parser.add_argument(
        "--skip-once",
        action="store_true",
        help="Leave out tests marked 'once' (PostgreSQL's own machinery: the same on every Django version).",
    )
    parser.add_argument(
        "--tier",
        action="append",
        default=[],
        choices=["unit", "ledger", "process", "chaos", "browser", "docs"],  # tests/conftest.py's TIER_DOCS
        help="Run only this tier (repeatable).",
    )
    parser.add_argument(
        "--serial",
        action="store_true",
        help="Run the PostgreSQL and SQLite passes one after the other (default: side by side).",
    )
    parser.add_argument(
        "--fast",
        action="store_true",
        help="The unit and ledger tiers on SQLite in memory, no lint (make test-fast).",
    )
    parser.add_argument(
        "--postgres-shards",
        type=int,
        choices=range(1, shards.COUNT + 1),
        default=shards.COUNT,
        metavar="{1,2,3}",
        help="Split the PostgreSQL pass into this many shards run side by side (tests/shards.py; "
        "default %(default)s). Test paths given as arguments make it one pass.",
    )
    parser.add_argument("pytest_args", nargs="*", help="Extra pytest arguments (e.g. -k sweep).")
    args = parser.parse_args()
    if args.fast:
        args.skip_lint, args.only = True, "sqlite"

    py = sys.executable
    results: dict[str, bool] = {}
    base_env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    base_env["PYTHONPATH"] = str(ROOT)
    base_env["ZEROLOSS_TEST_REDIS_URL"] = os.environ.get("ZEROLOSS_TEST_REDIS_URL", DEFAULT_REDIS)

    if not args.skip_lint:
        results["ruff"] = _run("ruff", [py, "-m", "ruff", "check", "."], base_env)
        results["ruff format"] = _run("ruff format", [py, "-m", "ruff", "format", "--check", "."], base_env)
        results["mypy"] = _run("mypy", [py, "-m", "mypy", "zeroloss", "tests", "benchmarks"], base_env)
        results["migrations"] = _run(
            "migrations", [py, "manage.py", "makemigrations", "--check", "--dry-run"], base_env
        )
        results["check"] = _run(
            "django check", [py, "manage.py", "check", "--fail-level", "WARNING"], base_env
        )
    if args.lint_only:
        return _summary(results)

    private = PrivateServices()
    try:
        return _tests(args, py, base_env, results, private)
    finally:
        private.stop()


def _tests(
    args: argparse.Namespace,
    py: str,
    base_env: dict[str, str],
    results: dict[str, bool],
    private: PrivateServices,
) -> int:
    pg_url = os.environ.get("ZEROLOSS_TEST_POSTGRES_URL", DEFAULT_PG)
    redis_url = base_env["ZEROLOSS_TEST_REDIS_URL"]
    missing = []
    if args.only != "sqlite" and not _reachable(pg_url, 5432):
        if "ZEROLOSS_TEST_POSTGRES_URL" in os.environ:
            missing.append(f"PostgreSQL at {pg_url} (ZEROLOSS_TEST_POSTGRES_URL)")
        else:
            try:
                pg_url = private.start_postgres()
            except RuntimeError as exc:
                missing.append(f"PostgreSQL at {pg_url}, and no private server could be started: {exc}")
    if not _reachable(redis_url, 6379):
        if "ZEROLOSS_TEST_REDIS_URL" in os.environ:
            missing.append(f"Redis at {redis_url} (ZEROLOSS_TEST_REDIS_URL)")
        else:
            try:
                redis_url = private.start_redis()
                base_env["ZEROLOSS_TEST_REDIS_URL"] = redis_url
            except RuntimeError as exc:
                missing.append(f"Redis at {redis_url}, and no private server could be started: {exc}")
    if missing:
        print(
            "The test suite needs these services and could not reach them:\n  " + "\n  ".join(missing),
            flush=True,
        )
        return 2
    # The replication tests start their own primary and standby from the same binaries.
    base_env.setdefault("ZEROLOSS_TEST_POSTGRES_URL", pg_url)

    pytest = [py, "-m", "pytest", *args.pytest_args]
    if not args.fast:
        pytest[3:3] = ["--file-times", "12"]  # what tests/shards.py is balanced by
    once = " and not once" if args.skip_once else ""
    if args.fast:
        args.tier = args.tier or ["unit", "ledger"]
    if args.tier:
        once += f" and ({' or '.join(args.tier)})"
    if args.fast:
        base_env["ZEROLOSS_TEST_SQLITE_MEMORY"] = "1"
        # the tests that take a budget (the state machine's examples) take their smaller one
        base_env["ZEROLOSS_TEST_FAST"] = "1"
        # one process by default: pytest-xdist workers each build their own in-memory test
        # database, which cost more CPU than they saved (ZEROLOSS_TEST_FAST_WORKERS=auto: per core)
        pytest[3:3] = ["-n", os.environ.get("ZEROLOSS_TEST_FAST_WORKERS", "0")]
    passes: list[tuple[str, list[str], dict[str, str]]] = []
    both = args.only is None
    redis_urls = _redis_urls(base_env["ZEROLOSS_TEST_REDIS_URL"], both, _shard_count(args))
    if isinstance(redis_urls, str):
        print(redis_urls, flush=True)
        return 2
    if args.only != "sqlite":
        count = _shard_count(args)
        for shard in range(1, count + 1):
            url = shards.database_for(pg_url, shard)
            # each shard its own database, Redis database and var dir: they share no state
            env = dict(base_env, DATABASE_URL=url, ZEROLOSS_TEST_REDIS_URL=redis_urls[f"postgres{shard}"])
            env["ZEROLOSS_TEST_POSTGRES_URL"] = url
            suffix = "" if shard == 1 else f"-{shard}"
            env.setdefault("ZEROLOSS_VAR_DIR", str(ROOT / "var" / f"test-postgres{suffix}"))
            if "ZEROLOSS_VAR_DIR" in os.environ and shard > 1:
                env["ZEROLOSS_VAR_DIR"] = f"{os.environ['ZEROLOSS_VAR_DIR']}{suffix}"
            cmd = [*pytest, "-m", f"not sqlite_only{once}"]
            name = "pytest postgres"
            if count > 1:
                cmd[3:3] = ["--postgres-shard", str(shard)]
                name = f"pytest postgres{shard}"
            passes.append((name, cmd, env))
    if args.only != "postgres":
        env = dict(base_env, ZEROLOSS_TEST_REDIS_URL=redis_urls["sqlite"])
        env.setdefault("ZEROLOSS_VAR_DIR", str(ROOT / "var" / "test-sqlite"))
        passes.append(("pytest sqlite", [*pytest, "-m", f"not postgres_only{once}"], env))
    for index, (_, _, env) in enumerate(passes):
        # tests/infra/pgcluster.py's free_port(): each pass its own 1000 ports below 32768
        env.setdefault("ZEROLOSS_TEST_PORTS", f"{21000 + 1000 * index}-{21999 + 1000 * index}")
    if len(passes) > 1 and not args.serial:
        results.update(_run_side_by_side(passes))
    else:
        for name, cmd, env in passes:
            results[name] = _run(name, cmd, env)
    return _summary(results)


def _shard_count(args: argparse.Namespace) -> int:
    """The PostgreSQL pass's shards: one when test paths are given (a shard would drop the
    files of the others)."""
    named = any(Path(arg.split("::")[0]).exists() for arg in args.pytest_args if not arg.startswith("-"))
    return 1 if named or args.only == "sqlite" else args.postgres_shards


def _redis_db(url: str) -> int:
    return int((urlparse(url).path or "/0").lstrip("/") or 0)


def _redis_urls(first: str, both: bool, count: int) -> dict[str, str] | str:
    """Each pass's Redis database (tests flush theirs, so passes side by side never share one):
    the first PostgreSQL shard ``first``'s; the SQLite pass ``ZEROLOSS_TEST_REDIS_URL_SQLITE``'s,
    shard N ``ZEROLOSS_TEST_REDIS_URL_SHARD<N>``'s, each by default the next free one below
    ``first``'s (``/15`` -> ``/14``, ``/13``, ``/12``; never ``/0``, the one applications use).
    A string: why the databases named collide."""
    parsed = urlparse(first)
    wanted = [f"postgres{n}" for n in range(2, count + 1)]
    if both:
        wanted.insert(0, "sqlite")
    urls = {"postgres1": first, "sqlite": first}
    taken = {_redis_db(first)}
    env_names = {"sqlite": "ZEROLOSS_TEST_REDIS_URL_SQLITE"}
    env_names.update({f"postgres{n}": f"ZEROLOSS_TEST_REDIS_URL_SHARD{n}" for n in range(2, count + 1)})
    for name in wanted:  # the ones named first, so a default never takes one of theirs
        if os.environ.get(env_names[name]):
            urls[name] = os.environ[env_names[name]]
    named = [urls[n] for n in ("postgres1", *wanted) if n == "postgres1" or os.environ.get(env_names[n])]
    if len({(urlparse(u).netloc, _redis_db(u)) for u in named}) < len(named):
        return "Passes side by side need distinct Redis databases: " + ", ".join(named)
    taken |= {_redis_db(u) for u in named}
    candidates = [*range(_redis_db(first) - 1, 0, -1), *range(_redis_db(first) + 1, 16)]
    for name in wanted:
        if not os.environ.get(env_names[name]):
            db = next(d for d in candidates if d not in taken)
            taken.add(db)
            urls[name] = parsed._replace(path=f"/{db}").geturl()
    return urls


def _run_side_by_side(passes: list[tuple[str, list[str], dict[str, str]]]) -> dict[str, bool]:
    """Run the passes at once (each its own database, Redis database and var dir: they share no
    state), every output line prefixed with its pass; the two cores of a small machine are
    busy together instead of one after the other."""
    import threading

    started = time.monotonic()
    finished: dict[str, float] = {}

    def pump(name: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"[{name.split()[-1]}] {line}", end="", flush=True)
            if line.startswith(("FAILED ", "ERROR ")):
                FAILURES.append(f"[{name.split()[-1]}] {line.rstrip()}")
        proc.wait()
        finished[name] = time.monotonic() - started
        print(
            f"=== {name}: {'ok' if _passed(name, proc.returncode) else 'FAILED'} ({finished[name]:.0f}s)",
            flush=True,
        )

    running = []
    for name, cmd, env in passes:
        print(f"\n=== {name} (side by side): {' '.join(cmd)}", flush=True)
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        thread = threading.Thread(target=pump, args=(name, proc), daemon=True)
        thread.start()
        running.append((name, proc, thread))
    results = {}
    for name, proc, thread in running:
        thread.join()
        results[f"{name} ({finished[name]:.0f}s)"] = _passed(name, proc.returncode)
    return results


def _passed(name: str, code: int) -> bool:
    """A shard other than the first may have nothing left to run (``--skip-once`` takes every
    test of shard 3): pytest's "no tests collected" (5) is a pass for it."""
    return code == 0 or (code == 5 and name in ("pytest postgres2", "pytest postgres3"))


def _summary(results: dict[str, bool]) -> int:
    print("\n=== summary")
    for name, ok in results.items():
        print(f"  {'ok    ' if ok else 'FAILED'} {name}")
    # pytest's short summary lines of the passes side by side, so a log's tail names them
    for line in FAILURES[:40]:
        print(f"  {line[:300]}")
    print(f"=== {time.monotonic() - STARTED:.1f}s wall in all", flush=True)
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
