"""A throwaway PostgreSQL primary with a real streaming standby, for the replication tests.

Everything lives in one temporary directory owned by the ``postgres`` OS user (PostgreSQL
refuses to run as root): the primary is ``initdb``-ed with ``wal_level=replica`` and a
pg_hba that allows replication from loopback; the standby is a ``pg_basebackup -R`` of it
with its own ``application_name``. Both listen on free loopback ports and on a Unix socket
inside the temporary directory, so nothing touches the machine's own cluster.

Every step is bounded in time; a missing binary or a server that does not come up is an
:class:`ClusterError` with the server log, never a skip.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg

from tests.support.waiting import wait_until

STEP_TIMEOUT = 60


def find_bin() -> Path:
    """The PostgreSQL server binaries: ``ZEROLOSS_PG_BIN``, a Debian/Ubuntu install, ``pg_config
    --bindir``, or the ``pgserver`` wheel (``pip install pgserver``), in that order."""
    if os.environ.get("ZEROLOSS_PG_BIN"):
        return Path(os.environ["ZEROLOSS_PG_BIN"])
    versions = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").is_file()]
    if versions:
        return max(versions, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    pg_config = shutil.which("pg_config")
    if pg_config:
        bindir = Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True).stdout.strip())
        if (bindir / "initdb").is_file():
            return bindir
    try:
        import pgserver
    except ImportError:
        return Path("/usr/lib/postgresql/15/bin")
    return Path(pgserver.__file__).parent / "pginstall" / "bin"


BIN = find_bin()


class ClusterError(RuntimeError):
    """The test cluster could not be set up; the message says why."""


def free_port() -> int:
    """A loopback port free now. Under ``python -m tests.suite`` each pass run side by side has
    its own range (``ZEROLOSS_TEST_PORTS``, ``first-last``, below the kernel's ephemeral ports):
    a port one pass found free and released is never the one another pass picks next."""
    span = os.environ.get("ZEROLOSS_TEST_PORTS", "")
    first, _, last = span.partition("-")
    if first.isdigit() and last.isdigit():
        ports = [p for p in range(int(first), int(last) + 1) if p not in _HANDED_OUT]
        random.shuffle(ports)  # processes of one pass (tests and their children) rarely meet
        for port in ports:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _HANDED_OUT.add(port)
            return port
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no loopback port left that this process has not handed out")


#: Every port :func:`free_port` returned in this process: a fixture that picks several ports
#: before it starts any server (a monitor and its nodes) never gets the same one twice.
_HANDED_OUT: set[int] = set()


def _as_postgres(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    runuser = shutil.which("runuser")
    if runuser is None:
        raise ClusterError("running as root but `runuser` is missing: cannot start PostgreSQL as postgres")
    return [runuser, "-u", "postgres", "--", *cmd]


class PgCluster:
    """``start()`` the primary, ``start_standby()``/``stop_standby()`` at will, ``stop()`` removes it all."""

    #: Where the servers listen (``listen_addresses``), besides their Unix socket.
    listen_addresses = "127.0.0.1"
    #: pg_hba.conf lines allowed besides loopback and the socket (a subclass's private network).
    extra_hba = ""
    #: Prepended to every server command (e.g. ``ip netns exec NAME``: the server in a namespace).
    command_prefix: tuple[str, ...] = ()
    #: Passed to initdb besides the data directory (``--waldir PATH``: pg_wal on another disk).
    initdb_extra: tuple[str, ...] = ()

    def __init__(
        self, *, standby_name: str = "zl-standby-1", dbname: str = "zeroloss", max_connections: int = 60
    ) -> None:
        self.max_connections = max_connections
        for tool in ("initdb", "pg_ctl", "pg_basebackup", "postgres"):
            if not (BIN / tool).is_file():
                raise ClusterError(
                    f"{BIN / tool} not found: the replication tests need the PostgreSQL server binaries "
                    "(apt-get install postgresql-15, or set ZEROLOSS_PG_BIN)."
                )
        self.standby_name = standby_name
        self.dbname = dbname
        self.root = Path(tempfile.mkdtemp(prefix="zl-pgcluster-"))
        os.chmod(self.root, 0o700)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.primary_dir = self.root / "primary"
        self.standby_dir = self.root / "standby"
        self.primary_port = free_port()
        self.standby_port = free_port()
        self._started: set[Path] = set()
        atexit.register(self.stop)

    # -- plumbing -----------------------------------------------------------------------

    def _run(self, cmd: list[str], what: str, timeout: float = STEP_TIMEOUT) -> str:
        try:
            done = subprocess.run(
                [*self.command_prefix, *_as_postgres(cmd)],
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=self.root,
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{what} did not finish in {timeout}s: {exc.stderr!r}") from exc
        if done.returncode != 0:
            raise ClusterError(f"{what} failed ({done.returncode}): {done.stderr.strip()}{self._logs()}")
        return done.stdout

    def _logs(self) -> str:
        out = []
        for log in (self.root / "primary.log", self.root / "standby.log"):
            if log.exists():
                out.append(f"\n--- {log.name} (tail) ---\n" + "\n".join(log.read_text().splitlines()[-20:]))
        return "".join(out)

    def _pg_ctl_start(self, datadir: Path, port: int, log: Path) -> None:
        opts = (
            f"-c port={port} -c listen_addresses='{self.listen_addresses}' "
            f"-c unix_socket_directories={self.root}"
        )
        self._run(
            [str(BIN / "pg_ctl"), "start", "-w", "-t", "30", "-D", str(datadir), "-l", str(log), "-o", opts],
            f"pg_ctl start {datadir.name}",
        )
        self._started.add(datadir)

    def _pg_ctl_stop(self, datadir: Path, mode: str = "fast") -> None:
        if datadir in self._started:
            self._run(
                [str(BIN / "pg_ctl"), "stop", "-w", "-t", "30", "-m", mode, "-D", str(datadir)],
                f"pg_ctl stop {datadir.name}",
            )
            self._started.discard(datadir)

    def url(self, *, standby: bool = False, dbname: str | None = None) -> str:
        port = self.standby_port if standby else self.primary_port
        return f"postgres://postgres@127.0.0.1:{port}/{dbname or self.dbname}"

    def connect(self, *, standby: bool = False, dbname: str | None = None) -> psycopg.Connection:
        return psycopg.connect(self.url(standby=standby, dbname=dbname), autocommit=True, connect_timeout=10)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        self._run(
            [
                str(BIN / "initdb"),
                "-D",
                str(self.primary_dir),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-instructions",
                *self.initdb_extra,
            ],
            "initdb",
        )
        with open(self.primary_dir / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# zeroloss test primary\nwal_level = replica\nmax_wal_senders = 10\nfsync = on\n"
                f"synchronous_commit = on\nmax_connections = {self.max_connections}\nshared_buffers = 32MB\n"
                "wal_keep_size = 256MB\nhot_standby = on\n"
            )
        with open(self.primary_dir / "pg_hba.conf", "w") as hba:
            hba.write(
                "local all all trust\nlocal replication all trust\n"
                "host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n" + self.extra_hba
            )
        self._pg_ctl_start(self.primary_dir, self.primary_port, self.root / "primary.log")
        with self.connect(dbname="postgres") as conn:
            conn.execute(f'CREATE DATABASE "{self.dbname}"')

    def start_standby(self, *, timeout: float = 30) -> None:
        """Start the standby (taking the base backup the first time) and wait until it streams."""
        if not self.standby_dir.exists():
            self._run(
                [
                    str(BIN / "pg_basebackup"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.primary_port),
                    "-U",
                    "postgres",
                    "-D",
                    str(self.standby_dir),
                    "-R",
                    "-X",
                    "stream",
                    "-c",
                    "fast",
                ],
                "pg_basebackup",
            )
            with open(self.standby_dir / "postgresql.auto.conf", "a") as auto:
                auto.write(
                    f"primary_conninfo = 'host=127.0.0.1 port={self.primary_port} user=postgres "
                    f"application_name={self.standby_name}'\n"
                )
        self._pg_ctl_start(self.standby_dir, self.standby_port, self.root / "standby.log")
        if not self.wait_streaming(1, timeout):
            raise ClusterError(f"standby is not streaming after {timeout}s{self._logs()}")

    def stop_standby(self) -> None:
        self._pg_ctl_stop(self.standby_dir)

    def restart_primary(self) -> None:
        self._pg_ctl_stop(self.primary_dir)
        self._pg_ctl_start(self.primary_dir, self.primary_port, self.root / "primary.log")

    def streaming(self) -> int:
        with self.connect() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"
            ).fetchone()
            return int(row[0]) if row else 0

    def wait_streaming(self, count: int, timeout: float) -> bool:
        return bool(wait_until(lambda: self.streaming() == count, timeout, interval=0.1))

    def stop(self) -> None:
        """Stop both servers and remove the directory. Safe to call twice, and on half-set-up clusters."""
        for datadir in (self.standby_dir, self.primary_dir):
            with contextlib.suppress(ClusterError):
                self._pg_ctl_stop(datadir, mode="immediate")
        shutil.rmtree(self.root, ignore_errors=True)
        atexit.unregister(self.stop)
