"""Real OS processes for the tests: the one process wrapper (:class:`Proc`) and the launchers of
``zeroloss_worker``, Celery workers and beat.

A process is waited on for a readiness signal (a line of its output, :meth:`Proc.wait_for`), with a
deadline; it runs in its own session, so stopping it stops everything it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from project.demo.run import celery_beat_command, celery_worker_command
from tests.support import ROOT
from tests.support.waiting import wait_for


class Proc:
    """A process in its own session (so SIGKILL reaches its whole group), with captured output."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.args = args
        self.popen = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.output: list[str] = []
        #: Sessions of this process carry it (PGAPPNAME), so a kill can wait for exactly them.
        self.app_name = env.get("PGAPPNAME", "")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.output.append(line)

    @property
    def text(self) -> str:
        return "".join(self.output)

    def records(self) -> list[dict[str, Any]]:
        """The JSON lines printed so far (the child's log lines are skipped)."""
        out = []
        for line in list(self.output):
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def wait(self, timeout: float) -> int:
        """The exit code; the test fails if the process still runs after ``timeout`` seconds."""
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"{self.args[2:4]} still running after {timeout}s:\n{self.text[-3000:]}"
            ) from exc
        self._reader.join(timeout=5)
        return code

    def wait_for(self, needle: str, timeout: float = 60) -> None:
        """Until ``needle`` is in the output; the test fails if the process exits first."""

        def seen() -> bool:
            if needle in self.text:
                return True
            if self.popen.poll() is not None:
                raise AssertionError(
                    f"{self.args[2:4]} exited ({self.popen.returncode}) before {needle!r}:\n{self.text[-4000:]}"
                )
            return False

        wait_for(lambda: f"{needle!r} in the output of {self.args[2:4]}:\n{self.text[-4000:]}", seen, timeout)

    def sigkill_group(self) -> None:
        """SIGKILL the whole group; return once nothing it started can still change the database.

        ``kill`` only queues the signal, and a statement the process had already sent keeps
        running in its PostgreSQL backend and may commit after the process is gone (a claim
        seen in CI landed after the test had listed the in-flight messages). So wait for every
        process of the group to be gone, then for their database sessions to end.
        """
        os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)
        _wait_until_group_gone(self.popen.pid)
        wait_until_other_sessions_gone(app_name=self.app_name)

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code, or None if it still runs after ``timeout`` seconds."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, timeout: float = 30) -> int:
        return self.stop(signal.SIGTERM, timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        """Send ``sig`` to the whole group and wait for the exit (SIGKILL after ``timeout`` s)."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
                self.popen.wait(timeout=timeout)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
        self._reader.join(timeout=5)
        return self.popen.returncode


def _live_group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process exited while we looked
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        state, _ppid, pgrp = text[text.rfind(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members


def _wait_until_group_gone(pgid: int, timeout: float = 10) -> None:
    wait_for(
        f"every process of group {pgid} gone after SIGKILL",
        lambda: not _live_group_members(pgid),
        timeout,
        interval=0.02,
    )


def wait_until_other_sessions_gone(timeout: float = 15, app_name: str = "") -> None:
    """Wait until this test is the only client of its PostgreSQL database (no-op on SQLite);
    with ``app_name``, until no session of that application name is left."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return  # SQLite writes happen inside the process: a dead process writes nothing more

    def gone() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT array_agg(pid) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                " AND (%s = '' OR application_name = %s)",
                [app_name, app_name],
            )
            (others,) = cursor.fetchone()
        return not others

    wait_for("the other database sessions closed after the kill", gone, timeout, interval=0.02)


def worker_env(broker_url: str, **extra: str) -> dict[str, str]:
    # tests.conftest imports the models: a child that imports this module has no settings yet
    from tests.conftest import child_env

    env = child_env(CELERY_BROKER_URL=broker_url, ZEROLOSS_LOG_LEVEL="INFO")
    env.update(extra)
    return env


def celery_worker(broker_url: str, *, concurrency: int = 2, name: str = "w1", **extra: str) -> Proc:
    proc = Proc(
        celery_worker_command(
            concurrency=concurrency, loglevel="INFO", hostname=f"{name}@%h", heartbeat=False
        ),
        worker_env(broker_url, **extra),
    )
    proc.wait_for("ready.")
    return proc


def celery_beat(broker_url: str, schedule_dir: Path, *, under: tuple[str, ...] = (), **extra: str) -> Proc:
    """Celery beat; ``under`` is a command it runs under (``("faketime", "-f", "-5s")``)."""
    return Proc(
        [
            *under,
            *celery_beat_command(loglevel="INFO", schedule=schedule_dir / "beat-schedule"),
            "--pidfile",
            "",
        ],
        worker_env(broker_url, **extra),
    )


def db_worker(*args: str, **extra: str) -> Proc:
    from tests.conftest import child_env

    env = child_env(ZEROLOSS_LOG_LEVEL="INFO")
    env.update(extra)
    return Proc([sys.executable, "manage.py", "zeroloss_worker", *args], env)
