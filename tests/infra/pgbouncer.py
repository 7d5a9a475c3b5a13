"""A throwaway PgBouncer in front of one PostgreSQL server, for connection-pooler tests.

Debian's ``pgbouncer`` package (1.18 on bookworm) is installed, bounded in time, when missing;
its packaged service is not started (Debian's policy-rc.d in containers, and we never use it).
Our instance runs in the foreground as the ``postgres`` OS user (PgBouncer refuses to run as
root), from a temporary directory holding its ini, userlist, log, pid file and Unix socket, and
listens on a free 127.0.0.1 port. ``auth_type = trust``: any client user listed in the userlist
(only ``postgres``) is let in, and PgBouncer logs in upstream as that user.

What 1.18 means for clients (see ``tests/chaos/test_infra_fixtures.py`` for the proofs):

- transaction pooling hands a client a server connection per *transaction*: session state
  (``SET`` of an untracked setting, ``LISTEN``, advisory locks, temp tables, ``WITH HOLD``
  cursors) stays on the server connection and leaks to whichever client gets it next.
  PgBouncer does track and restore ``client_encoding``, ``DateStyle``, ``TimeZone``,
  ``standard_conforming_strings`` and ``application_name`` per client.
- no protocol-level (named) prepared statements in transaction mode: a statement prepared on
  one server connection is unknown on the next. ``max_prepared_statements`` (which makes
  PgBouncer track them) arrived in 1.21; asking for it here is a :class:`ClusterError`.
- startup parameters other than the tracked ones are refused ("unsupported startup parameter:
  options") unless listed in ``ignore_startup_parameters``; we list only ``extra_float_digits``,
  because an ignored ``options=-c statement_timeout=...`` would be dropped silently. Settings
  a client needs go in a ``SET LOCAL`` inside its transaction, or on the database/role.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from tests.infra.hacluster import _as_postgres_kwargs, ensure_debian_package
from tests.infra.pgcluster import ClusterError, free_port
from tests.support.waiting import wait_until

POOL_MODES = ("session", "transaction", "statement")


def pgbouncer_binary() -> str:
    return shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def ensure_pgbouncer(timeout: float = 300) -> None:
    """Install Debian's ``pgbouncer`` package if the binary is missing (bounded; ClusterError)."""
    ensure_debian_package("pgbouncer", ["pgbouncer"], timeout=timeout)


def pgbouncer_version() -> tuple[int, int]:
    """(major, minor) of the installed PgBouncer, from ``pgbouncer --version``."""
    out = subprocess.run([pgbouncer_binary(), "--version"], capture_output=True, text=True, timeout=10).stdout
    match = re.search(r"PgBouncer (\d+)\.(\d+)", out)
    if match is None:
        raise ClusterError(f"cannot read the PgBouncer version from {out!r}")
    return int(match.group(1)), int(match.group(2))


class PgBouncer:
    """``start()`` a PgBouncer for ``dbname`` on ``upstream_host:upstream_port``; ``url()`` to
    connect through it; ``reload()`` after editing ``ini``; ``stop()`` (safe twice, also at exit)."""

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        dbname: str,
        pool_mode: str = "transaction",
        max_prepared_statements: int = 0,
        *,
        pool_size: int = 5,
    ) -> None:
        if pool_mode not in POOL_MODES:
            raise ClusterError(f"pool_mode must be one of {POOL_MODES}, not {pool_mode!r}")
        if not upstream_host.startswith("127."):
            raise ClusterError(f"upstream {upstream_host!r} is not a loopback address")
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.dbname = dbname
        self.pool_mode = pool_mode
        self.max_prepared_statements = max_prepared_statements
        self.pool_size = pool_size
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="zl-pgbouncer-"))
        os.chmod(self.root, 0o700)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.ini = self.root / "pgbouncer.ini"
        self.log = self.root / "pgbouncer.log"
        self.proc: subprocess.Popen[bytes] | None = None
        atexit.register(self.stop)

    def _logs(self) -> str:
        if not self.log.exists():
            return ""
        return "\n--- pgbouncer.log (tail) ---\n" + "\n".join(
            self.log.read_text(errors="replace").splitlines()[-20:]
        )

    def write_config(self) -> None:
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": str(self.root),
            "auth_type": "trust",
            "auth_file": str(self.root / "userlist.txt"),
            "admin_users": "postgres",
            "pool_mode": self.pool_mode,
            "default_pool_size": str(self.pool_size),
            "max_client_conn": "100",
            "ignore_startup_parameters": "extra_float_digits",
            "pidfile": str(self.root / "pgbouncer.pid"),
        }
        if self.max_prepared_statements:
            settings["max_prepared_statements"] = str(self.max_prepared_statements)
        lines = [
            "[databases]",
            f"{self.dbname} = host={self.upstream_host} port={self.upstream_port} dbname={self.dbname}",
            "",
            "[pgbouncer]",
            *(f"{key} = {value}" for key, value in settings.items()),
        ]
        self.ini.write_text("\n".join(lines) + "\n")
        (self.root / "userlist.txt").write_text('"postgres" ""\n')
        if os.geteuid() == 0:
            for path in (self.ini, self.root / "userlist.txt"):
                shutil.chown(path, "postgres", "postgres")

    def start(self, timeout: float = 60) -> float:
        """Start PgBouncer and wait until a query through it reaches the upstream; returns seconds."""
        began = time.monotonic()
        ensure_pgbouncer(timeout)
        if self.max_prepared_statements and pgbouncer_version() < (1, 21):
            raise ClusterError(
                f"max_prepared_statements needs PgBouncer >= 1.21, this is {pgbouncer_version()}: "
                "use max_prepared_statements=0 and keep clients off named prepared statements"
            )
        self.write_config()
        with open(self.log, "ab") as log:  # no logfile= setting: it logs to stderr, i.e. here
            self.proc = subprocess.Popen(
                [pgbouncer_binary(), str(self.ini)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,
                **_as_postgres_kwargs(),
            )
        last: object = None

        def serving() -> bool:
            nonlocal last
            if self.proc is not None and self.proc.poll() is not None:
                raise ClusterError(f"pgbouncer exited with {self.proc.returncode}{self._logs()}")
            try:
                with self.connect() as conn:
                    conn.execute("SELECT 1")
                return True
            except psycopg.Error as exc:
                last = exc
                return False

        if wait_until(serving, max(0.0, began + timeout - time.monotonic()), interval=0.1):
            return time.monotonic() - began
        raise ClusterError(
            f"pgbouncer did not serve a query in {timeout}s (last error: {last}){self._logs()}"
        )

    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.dbname}"

    def connect(self, **kwargs: Any) -> psycopg.Connection:
        """An autocommit psycopg connection through PgBouncer (keyword arguments override)."""
        options: dict[str, Any] = {"autocommit": True, "connect_timeout": 5, **kwargs}
        return psycopg.connect(self.url(), **options)

    def _admin(self, command: str) -> tuple[list[str], list[tuple[str | None, ...]]]:
        # The admin console speaks only the simple query protocol; psycopg's execute() uses the
        # extended one, so go through the libpq wrapper (PQexec) directly.
        conn = psycopg.connect(
            f"postgres://postgres@127.0.0.1:{self.port}/pgbouncer", autocommit=True, connect_timeout=5
        )
        try:
            result = conn.pgconn.exec_(command.encode())
        finally:
            conn.close()
        if result.status not in (psycopg.pq.ExecStatus.TUPLES_OK, psycopg.pq.ExecStatus.COMMAND_OK):
            raise ClusterError(
                f"pgbouncer admin {command!r}: {result.error_message.decode(errors='replace')}"
            )
        names = [(result.fname(col) or b"").decode() for col in range(result.nfields)]
        rows = []
        for row in range(result.ntuples):
            values = (result.get_value(row, col) for col in range(result.nfields))
            rows.append(tuple(v.decode() if v is not None else None for v in values))
        return names, rows

    def admin(self, command: str) -> list[tuple[str | None, ...]]:
        """Run a command on the admin console (the ``pgbouncer`` database), e.g. ``RELOAD``."""
        return self._admin(command)[1]

    def show(self, what: str) -> list[dict[str, str | None]]:
        """``SHOW <what>`` on the admin console as dicts, e.g. ``show("POOLS")``."""
        names, rows = self._admin(f"SHOW {what}")
        return [dict(zip(names, row, strict=True)) for row in rows]

    def reload(self) -> None:
        """Rewrite the ini from the attributes (e.g. after changing ``pool_mode``) and RELOAD it."""
        self.write_config()
        self.admin("RELOAD")

    def stop(self) -> None:
        """Stop PgBouncer (SIGINT: immediate shutdown, then SIGKILL) and remove its directory."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)
        atexit.unregister(self.stop)
