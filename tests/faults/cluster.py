"""The servers the fault suite starts, owns and breaks: a private PostgreSQL and a private Redis.

:class:`FaultCluster` is :class:`tests.infra.pgcluster.PgCluster` (initdb into a temporary directory,
run as the ``postgres`` user, on a free loopback port) plus the faults: ``pg_ctl restart`` in
``immediate`` or ``fast`` mode, timed to the first accepted connection afterwards, and
``pg_terminate_backend`` of every session of a database. :class:`RedisServer` is a
``redis-server`` on a free loopback port that can be flushed and restarted on the same port.

Every wait is bounded; both register ``atexit`` clean-ups besides their ``stop()``.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from tests.infra.pgcluster import ClusterError, PgCluster, free_port
from tests.support.waiting import pause, wait_until

from .zeroloss_handlers import EFFECT_TABLE

if TYPE_CHECKING:
    import redis

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE_DB = "zl_faults_template"


@dataclass(frozen=True)
class Restart:
    mode: str
    #: Wall-clock times (``time.time()``): stop began, the server was down, first connection accepted.
    began: float
    down: float
    up: float

    @property
    def outage(self) -> float:
        return self.up - self.began


class _Probe(threading.Thread):
    """Connects every 10 ms until the server accepts a connection; ``at`` is when it first did."""

    def __init__(self, url: str) -> None:
        super().__init__(name="pg-probe", daemon=True)
        self.url = url
        self.at: float | None = None
        self._stop_probe = threading.Event()

    def run(self) -> None:
        while not self._stop_probe.is_set():
            try:
                with psycopg.connect(self.url, connect_timeout=1):
                    self.at = time.time()
                    return
            except psycopg.Error:
                pause(self._stop_probe, 0.01)  # the next try, unless the probe was given up

    def result(self, timeout: float) -> float:
        self.join(timeout)
        self._stop_probe.set()
        if self.at is None:
            raise ClusterError(f"PostgreSQL did not accept a connection within {timeout}s of its start")
        return self.at


class FaultCluster(PgCluster):
    """A private primary whose databases are copies of one migrated template (fast to create)."""

    def __init__(self) -> None:
        super().__init__(dbname=TEMPLATE_DB, max_connections=150)

    def start(self) -> None:
        super().start()
        with self.connect(dbname="postgres") as conn:
            # The server log's times (when a restarted server became ready) in UTC, to the ms.
            conn.execute("ALTER SYSTEM SET log_timezone = 'UTC'")
            conn.execute("SELECT pg_reload_conf()")
        self.prepare_template()

    def prepare_template(self) -> None:
        """Migrate the template database and add the transactional handler's effect table."""
        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
            cwd=ROOT,
            env=_django_env(self.url()),
            capture_output=True,
            text=True,
            timeout=180,
        )
        if migrate.returncode != 0:
            raise ClusterError(f"migrate failed: {migrate.stdout}{migrate.stderr}")
        with self.connect() as conn:
            conn.execute(
                f"CREATE TABLE {EFFECT_TABLE} (id bigserial PRIMARY KEY, message_id text NOT NULL, "
                "attempt int NOT NULL, pid int NOT NULL, token uuid, "
                "committed_at timestamptz NOT NULL DEFAULT clock_timestamp())"
            )

    def create_database(self, name: str) -> str:
        """A fresh, migrated database (a copy of the template); returns its URL."""
        with self.connect(dbname="postgres") as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE_DB}"')
        return self.url(dbname=name)

    # -- faults ---------------------------------------------------------------------------

    def restart(
        self,
        mode: str,
        *,
        down_for: float = 0.0,
        dbname: str | None = None,
        stop: threading.Event | None = None,
    ) -> Restart:
        """``pg_ctl stop -m MODE``, stay down ``down_for`` seconds (less if the run's ``stop`` is set
        meanwhile), start; timed to the first connection the restarted server accepts (to ``dbname``)."""
        if mode not in ("immediate", "fast"):
            raise ValueError(f"restart mode must be immediate or fast, not {mode!r}")
        began = time.time()
        self._pg_ctl_stop(self.primary_dir, mode=mode)
        down = time.time()
        pause(stop or threading.Event(), down_for)  # the fault itself: the outage's length
        probe = _Probe(self.url(dbname=dbname))
        probe.start()
        self._pg_ctl_start(self.primary_dir, self.primary_port, self.root / "primary.log")
        probed = probe.result(timeout=60)
        # The postmaster logs the moment it accepts connections; the probe only samples it.
        ready = self._ready_logged_after(down)
        return Restart(mode, began, down, min(probed, ready) if ready else probed)

    def stop_server(self, mode: str = "fast") -> float:
        """Stop the server (until :meth:`start_server`); returns when it was down."""
        self._pg_ctl_stop(self.primary_dir, mode=mode)
        return time.time()

    def is_running(self) -> bool:
        return self.primary_dir in self._started

    def start_server(self) -> None:
        self._pg_ctl_start(self.primary_dir, self.primary_port, self.root / "primary.log")

    def terminate_sessions(self, dbname: str) -> int:
        """``pg_terminate_backend`` of every client session of ``dbname`` (but this one)."""
        with self.connect(dbname="postgres") as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                [dbname],
            ).fetchone()
        return int(row[0]) if row else 0

    def _ready_logged_after(self, after: float) -> float | None:
        """When the server last logged "ready to accept connections" (after ``after``)."""
        log = self.root / "primary.log"
        found = None
        for line in log.read_text(errors="replace").splitlines():
            if "database system is ready to accept connections" in line:
                with contextlib.suppress(ValueError):
                    stamp = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=dt.UTC)
                    if stamp.timestamp() > after:
                        found = stamp.timestamp()
        return found

    def log_tail(self, lines: int = 40) -> str:
        log = self.root / "primary.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def _django_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(DATABASE_URL=url, PYTHONPATH=str(ROOT), DJANGO_SETTINGS_MODULE="project.settings")
    return env


class RedisServer:
    """A private ``redis-server`` (no persistence: a restart loses everything, like FLUSHALL)."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ClusterError("redis-server is not installed (Debian/Ubuntu: apt-get install redis-server)")
        self.binary = binary
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="zl-faults-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None
        atexit.register(self.stop)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self) -> redis.Redis:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, socket_connect_timeout=5)

    def start(self, timeout: float = 20) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        proc = self.proc

        def answering() -> bool:
            if proc.poll() is not None:
                raise ClusterError(f"redis-server on port {self.port} exited ({proc.returncode})")
            try:
                return bool(self.client().ping())
            except Exception:
                return False

        if not wait_until(answering, timeout):
            raise ClusterError(f"redis-server on port {self.port} did not start in {timeout}s")

    def flushall(self) -> int:
        """FLUSHALL; returns how many keys there were (tasks the broker then forgot)."""
        client = self.client()
        keys = sum(int(v.get("keys", 0)) for v in client.info("keyspace").values())
        client.flushall()
        return keys

    def restart(self, *, down_for: float = 0.0, stop: threading.Event | None = None) -> tuple[float, float]:
        """Kill the server (SIGKILL: an abrupt broker loss), stay down (less if the run's ``stop`` is
        set meanwhile), start again on the same port.

        Returns (went down, accepting again) as wall-clock times."""
        self.stop(remove=False)
        down = time.time()
        pause(stop or threading.Event(), down_for)  # the fault itself: the outage's length
        self.start()
        return down, time.time()

    def stop(self, *, remove: bool = True) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        self.proc = None
        if remove:
            shutil.rmtree(self.dir, ignore_errors=True)
            atexit.unregister(self.stop)
