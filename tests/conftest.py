"""Shared fixtures. The suite runs twice (PostgreSQL and SQLite); see the README's test command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from zeroloss.service import ZeroLossMessageService

ROOT = Path(__file__).resolve().parent.parent


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
    """Real OS processes running ``tests/child.py``; every one is killed at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(self, role: str, args: dict[str, Any] | None = None, **env: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.child", role, json.dumps(args or {})],
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
        deadline = time.monotonic() + timeout
        waiting = {f"{start}.ready.{p.pid}" for p in procs}
        while not all(Path(name).exists() for name in waiting):
            for p in procs:
                if p.poll() is not None:
                    raise AssertionError(f"child exited with {p.returncode} before the start: {_stderr(p)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"children not ready to start after {timeout}s")
            time.sleep(0.02)
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

    from zeroloss.telemetry import tracing

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
