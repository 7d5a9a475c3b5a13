"""Shared fixtures, and the test tiers. The suite runs twice (PostgreSQL and SQLite); see the
README's test command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.support.waiting import wait_for
from zeroloss.ledger.service import ZeroLossMessageService

ROOT = Path(__file__).resolve().parent.parent

# -- test tiers --------------------------------------------------------------------------------
#: What each tier may use. Every test file sits in the folder of its tier (``tests/ledger/``, ...); a
#: single test that needs more than its file's tier carries that tier's marker itself
#: (``@pytest.mark.process``).
TIER_DOCS = {
    "unit": "no database, no OS process",
    "ledger": "one database, threads at most, no OS process",
    "process": "OS processes: workers, management commands, private servers, compilers",
    "chaos": "the fault suite: killed, frozen, partitioned or failed-over servers and workers",
    "browser": "a real browser (Chromium through Playwright) against the live server",
    "docs": "the documentation's claims and examples, run as written",
}
#: The tiers whose outcome can depend on the Django version: CI runs them on every Django minor
#: version, the other tiers once (they are marked ``once`` at collection). ``make test-fast``
#: is unit + ledger.
DJANGO_TIERS = ("unit", "ledger", "browser")
FAST_TIERS = ("unit", "ledger")
HERE = Path(__file__).resolve().parent


def tier_of(path: Path) -> str | None:
    """A test file's tier: the folder it sits in (``tests/<tier>/test_x.py``)."""
    folder = path.resolve().parent
    return folder.name if folder.parent == HERE and folder.name in TIER_DOCS else None


_TIER = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--postgres-shard",
        type=int,
        default=None,
        metavar="N",
        help="Collect only the test files of the PostgreSQL pass's shard N (tests/shards.py).",
    )
    parser.addoption(
        "--file-times",
        type=int,
        default=0,
        metavar="N",
        help="Print the N test files that took longest (setup, call and teardown): how shards are balanced.",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``--postgres-shard N``, the files of the other shards are not even imported."""
    shard = config.getoption("--postgres-shard")
    if shard is None or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    from tests import shards

    return True if shards.shard_of(collection_path.name) != shard else None


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    from tests import shards

    shard = config.getoption("--postgres-shard")
    if shard is not None and not 1 <= shard <= shards.COUNT:
        raise pytest.UsageError(
            f"--postgres-shard {shard}: the shards are 1 to {shards.COUNT} (tests/shards.py)"
        )

    # Django's default hasher takes ~0.5 s a password by design; the admin tests make a user each.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


_DB_FIXTURES = {"db", "transactional_db", "live_server", "django_db_setup", "service", "live_service"}


def _how_to_tier(name: str) -> str:
    tiers = "\n".join(f"    {tier}: {what}" for tier, what in TIER_DOCS.items())
    return (
        f"{name} has no test tier: move it to the folder of the lightest tier that holds every one "
        f"of its tests, e.g. tests/ledger/{name}:\n{tiers}\n"
        "(one test that needs more carries that tier's marker itself, e.g. @pytest.mark.process)."
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give every test its tier (its own tier marker, else its file's folder), mark the
    tiers outside :data:`DJANGO_TIERS` ``once``, and refuse an untiered file or a unit test that
    asks for a database."""
    problems: dict[str, str] = {}
    for item in items:
        name = item.path.name
        own = {m.name for m in item.iter_markers() if m.name in TIER_DOCS}
        if len(own) > 1:
            problems[item.nodeid] = (
                f"{item.nodeid} has several tier markers ({', '.join(sorted(own))}): keep one"
            )
            continue
        tier = own.pop() if own else tier_of(item.path)
        if tier is None:
            problems[name] = _how_to_tier(name)
            continue
        if tier == "unit" and (
            item.get_closest_marker("django_db") or _DB_FIXTURES & set(getattr(item, "fixturenames", ()))
        ):
            problems[item.nodeid] = (
                f"{item.nodeid} uses a database but its tier is unit: mark it @pytest.mark.ledger "
                "(or move its file to tests/ledger/)"
            )
            continue
        item.stash[_TIER] = tier
        item.add_marker(getattr(pytest.mark, tier))
        if tier not in DJANGO_TIERS:
            item.add_marker(pytest.mark.once)
    if problems:
        raise pytest.UsageError("\n".join(problems.values()))


def _encodable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under pytest-xdist (make test-fast) a report travels to the controller as UTF-8: the
    captured log of a test about lone surrogates in error texts would crash the worker."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        report.sections = [(title, _encodable(content)) for title, content in report.sections]
    name = report.nodeid.split("::")[0]
    _FILE_TIMES[name] = _FILE_TIMES.get(name, 0.0) + report.duration


_FILE_TIMES: dict[str, float] = {}


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    count = config.getoption("--file-times")
    if not count or not _FILE_TIMES:
        return
    slowest = sorted(_FILE_TIMES.items(), key=lambda item: -item[1])[:count]
    terminalreporter.write_sep("=", f"the {len(slowest)} slowest test files (s, tests/shards.py)")
    for name, seconds in slowest:
        terminalreporter.write_line(f"{seconds:8.1f}  {name}")


@pytest.fixture(autouse=True)
def _no_process_below_the_process_tier(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit or ledger test that starts an OS process fails saying how to re-tier it: those two
    tiers are ``make test-fast``, which must stay fast and in one process."""
    tier = request.node.stash.get(_TIER, None)
    if tier not in FAST_TIERS:
        return

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(
            f"{request.node.nodeid} (tier {tier}) started an OS process: mark it @pytest.mark.process, "
            "or move its file to tests/process/"
        )

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)


def database_url() -> str:
    """The URL of the database the tests run against (the test database, once created)."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    user = s.get("USER") or "postgres"
    host = s.get("HOST") or "127.0.0.1"
    port = s.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{s['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url()
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


class Children:
    """Real OS processes running ``tests/infra/child.py``; every one is killed at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(self, role: str, args: dict[str, Any] | None = None, **env: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.infra.child", role, json.dumps(args or {})],
            cwd=ROOT,
            env=child_env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(proc)
        return proc

    @staticmethod
    def start_together(start: Path, procs: list[subprocess.Popen[str]], timeout: float = 120) -> None:
        """Give ``start`` (a ``start_file``) once every child waits on it, connected: a fixed sleep
        would let a slow start-up on a loaded machine miss the overlap the test is about."""
        waiting = {f"{start}.ready.{p.pid}" for p in procs}

        def ready() -> bool:
            for p in procs:
                if p.poll() is not None:
                    raise AssertionError(f"child exited with {p.returncode} before the start: {_stderr(p)}")
            return all(Path(name).exists() for name in waiting)

        wait_for("the children ready to start", ready, timeout, interval=0.02)
        start.touch()

    @staticmethod
    def read_line(proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
        """The next JSON line a child prints (it keeps running)."""
        import selectors

        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"child printed nothing in {timeout}s; stderr: {_stderr(proc)}")
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"child exited with {proc.wait()}: {_stderr(proc)}")
        return json.loads(line)

    def run(
        self, role: str, args: dict[str, Any] | None = None, timeout: float = 120
    ) -> list[dict[str, Any]]:
        proc = self.spawn(role, args)
        return self.finish(proc, timeout)

    @staticmethod
    def finish(proc: subprocess.Popen[str], timeout: float = 120) -> list[dict[str, Any]]:
        out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"child failed ({proc.returncode}): {err}"
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    @staticmethod
    def sigkill(proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()


def _stderr(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        return "(still running)"
    assert proc.stderr is not None
    return proc.stderr.read()[-3000:]


@pytest.fixture
def children() -> Iterator[Children]:
    kids = Children()
    try:
        yield kids
    finally:
        kids.close()


@pytest.fixture
def service(db: None) -> ZeroLossMessageService:
    return ZeroLossMessageService(instance_id="test-worker")


@pytest.fixture
def live_service(transactional_db: None) -> ZeroLossMessageService:
    """A service over committed data, for tests where other processes must see it."""
    return ZeroLossMessageService(instance_id="test-parent")


@pytest.fixture
def spans():
    """This process's finished spans, from an SDK provider of the test's own: the global one
    can be set only once per process, and other tests' sends must carry no trace."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from zeroloss.integrations.telemetry import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    exporter.provider = provider  # type: ignore[attr-defined]
    tracing._tracer = provider.get_tracer("zeroloss")
    try:
        yield exporter
    finally:
        tracing._tracer = None
        provider.shutdown()


@pytest.fixture
def broker(settings: Any) -> Iterator[Any]:
    """Celery over the real Redis broker, on ``ZEROLOSS_TEST_REDIS_URL`` (emptied before and after)."""
    from tests.support.celery import celery_over_redis

    with celery_over_redis(settings) as client:
        yield client


@pytest.fixture
def procs() -> Iterator[list[Any]]:
    """The processes (:class:`tests.support.processes.Proc`) a test starts, stopped after it."""
    started: list[Any] = []
    yield started
    for proc in started:
        proc.terminate(timeout=15)
