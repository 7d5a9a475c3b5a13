"""A throwaway pg_auto_failover cluster (monitor + primary + standby) for failover tests.

Debian's ``postgresql-15-auto-failover`` package provides ``pg_autoctl`` and the monitor's
``pgautofailover`` extension; it is installed (bounded in time) when missing. Everything lives in
one temporary directory owned by the ``postgres`` OS user: three data directories, the
``pg_autoctl`` configuration and state files (``XDG_CONFIG_HOME``/``XDG_DATA_HOME``/
``XDG_RUNTIME_DIR`` point inside it, so nothing lands in ``~postgres``), the Unix sockets
(``PG_REGRESS_SOCK_DIR``, which ``pg_autoctl`` passes to ``postgres -k``) and one log per node.
Every server listens on 127.0.0.1 only (``--listen``; pg_autoctl's default is ``*``).

Each node is one long-running ``pg_autoctl create ... --run`` process (the keeper), started in
its own session so that teardown can signal its whole process group; ``pg_autoctl`` runs
``postgres`` as its own child and restarts it when it dies, which is why :meth:`HaCluster.kill_primary`
kills the keeper together with the postmaster.

Replication: with one standby, pg_auto_failover only accepts ``number_sync_standbys = 0`` (it
needs ``number_sync_standbys + 1`` quorum standbys), and that setting still means *synchronous*
commits while the standby is healthy: the primary gets ``synchronous_standby_names = 'ANY 1
(pgautofailover_standby_2)'`` because the standby has ``replication-quorum true``. Turning the
standby's replication quorum off makes the primary set ``synchronous_standby_names = ''``
(asynchronous commits). When the standby is unhealthy the primary goes to ``wait_primary`` and
drops synchronous replication itself (availability over a second copy, pg_auto_failover's
``number_sync_standbys = 0`` contract).

Run ``python -m tests.infra.hacluster --runs 3 [--default-timings]`` to measure start and failover times.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from tests.infra.pgcluster import BIN, ClusterError, free_port
from tests.support import debian
from tests.support.waiting import wait_until

FORMATION = "default"
PG_VERSION = BIN.parent.name if BIN.parent.name.isdigit() else "15"
AUTO_FAILOVER_PACKAGE = f"postgresql-{PG_VERSION}-auto-failover"

# Monitor settings (``pgautofailover.*`` GUCs, all reloadable) that make a test failover take
# seconds instead of ~50 s. Defaults in brackets. A dead node is declared unhealthy when its
# keeper has not reported for ``node_considered_unhealthy_timeout`` *and* the monitor's own
# health check failed; the standby is then promoted read-only and becomes writable
# (``wait_primary``) once the old primary had ``primary_demote_timeout`` to demote itself.
FAST_MONITOR_SETTINGS = {
    "pgautofailover.health_check_period": "1000",  # [5000 ms] how often the monitor probes nodes
    "pgautofailover.health_check_timeout": "2000",  # [5000 ms] connect timeout of one probe
    "pgautofailover.health_check_max_retries": "1",  # [2] probe retries before health = bad
    "pgautofailover.health_check_retry_delay": "500",  # [2000 ms]
    "pgautofailover.node_considered_unhealthy_timeout": "3000",  # [20000 ms] keeper silence allowed
    "pgautofailover.primary_demote_timeout": "5000",  # [30000 ms] old primary's time to demote itself
    "pgautofailover.startup_grace_period": "2000",  # [10000 ms] no failover right after monitor start
}
# The keeper side of the same safety argument: a primary whose keeper cannot reach the monitor
# and has no standby connected demotes itself after ``network_partition_timeout`` seconds [20].
# It must stay below node_considered_unhealthy_timeout + primary_demote_timeout (8 s here), so
# that a partitioned old primary has stopped accepting writes before the standby is promoted.
FAST_KEEPER_SETTINGS = {"timeout.network_partition_timeout": "3"}

# States in which a node accepts writes (the monitor's view).
WRITABLE_STATES = ("single", "primary", "wait_primary", "join_primary", "apply_settings")


def _as_postgres_kwargs() -> dict[str, Any]:
    """``Popen`` arguments that run the child as the ``postgres`` OS user when we are root."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": "postgres", "extra_groups": []}


def ensure_debian_package(package: str, present: list[Path | str], *, timeout: float = 300) -> None:
    """:func:`tests.support.debian.ensure_debian_package`, failing as a :class:`ClusterError`
    (what the cluster fixtures raise)."""
    try:
        debian.ensure_debian_package(package, present, timeout=timeout)
    except debian.DebianPackageError as exc:
        raise ClusterError(str(exc)) from exc


def _process_children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (read from /proc, so it works for processes we did not spawn)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # the command name (field 2) may contain spaces; the ppid is the 2nd field after ")"
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(stat.parent.name))
    return children


def _postmaster_pid(pgdata: Path) -> int | None:
    """The live postmaster of ``pgdata`` (first line of postmaster.pid), or None."""
    with contextlib.suppress(OSError, ValueError):
        pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"postgres" in cmdline and str(pgdata).encode() in cmdline:
            return pid
    return None


def _sigkill_postmaster(pgdata: Path) -> int | None:
    """SIGKILL the postmaster of ``pgdata`` and its children (backends, walsender, checkpointer...)."""
    pid = _postmaster_pid(pgdata)
    if pid is None:
        return None
    children = _process_children(pid)
    for victim in (pid, *children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    return pid


@dataclass
class Node:
    name: str
    port: int
    pgdata: Path
    log: Path
    keeper: subprocess.Popen[bytes] | None = None


class HaCluster:
    """``start()`` a monitor, a primary and a synchronous standby; ``kill_primary()`` and
    ``wait_for_failover()`` to fail over; ``stop()`` removes it all (safe twice, also at exit)."""

    def __init__(self, *, dbname: str = "zeroloss", fast_timings: bool = True) -> None:
        self.dbname = dbname
        self.fast_timings = fast_timings
        self.root = Path(tempfile.mkdtemp(prefix="zl-hacluster-"))
        os.chmod(self.root, 0o700)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.monitor = Node("monitor", free_port(), self.root / "monitor", self.root / "monitor.log")
        self.nodes = [
            Node(name, free_port(), self.root / name, self.root / f"{name}.log")
            for name in ("node1", "node2")
        ]
        self.killed: Node | None = None
        self.killed_at: float | None = None
        self._stopped = False
        atexit.register(self.stop)

    # -- plumbing -----------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        # A clean PATH: pg_autoctl probes every PATH entry for pg_ctl and logs an error for each
        # it may not read (root's ~/.pyenv etc. are not readable by postgres).
        return {
            "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.root),
            "USER": "postgres",
            "LOGNAME": "postgres",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "XDG_CONFIG_HOME": str(self.root / "config"),
            "XDG_DATA_HOME": str(self.root / "share"),
            "XDG_RUNTIME_DIR": str(self.root / "run"),
            "PG_REGRESS_SOCK_DIR": str(self.root),
            "PGHOST": str(self.root),
        }

    def _autoctl(self) -> str:
        return shutil.which("pg_autoctl") or "/usr/bin/pg_autoctl"

    def _run(self, args: list[str], what: str, timeout: float = 30) -> str:
        try:
            done = subprocess.run(
                [self._autoctl(), *args],
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=self.root,
                env=self._env(),
                **_as_postgres_kwargs(),
            )
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{what} did not finish in {timeout}s: {exc.stderr!r}{self._logs()}") from exc
        if done.returncode != 0:
            raise ClusterError(f"{what} failed ({done.returncode}): {done.stderr.strip()}{self._logs()}")
        return done.stdout

    def _spawn_keeper(self, node: Node, args: list[str]) -> None:
        with open(node.log, "ab") as log:
            node.keeper = subprocess.Popen(
                [self._autoctl(), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                env=self._env(),
                start_new_session=True,  # its own process group: teardown signals all of it
                **_as_postgres_kwargs(),
            )

    def _logs(self, lines: int = 25) -> str:
        out = []
        for node in (self.monitor, *self.nodes):
            if node.log.exists():
                tail = node.log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"\n--- {node.log.name} (tail) ---\n" + "\n".join(tail))
        return "".join(out)

    def _node(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def monitor_uri(self) -> str:
        return f"postgres://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover?sslmode=disable"

    def monitor_connect(self) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1",
            port=self.monitor.port,
            dbname="pg_auto_failover",
            user="postgres",
            autocommit=True,
            connect_timeout=2,
        )

    def connect(self, port: int, *, dbname: str | None = None) -> psycopg.Connection:
        """A direct (single-host) autocommit connection to one node."""
        return psycopg.connect(
            host="127.0.0.1",
            port=port,
            dbname=dbname or self.dbname,
            user="postgres",
            autocommit=True,
            connect_timeout=2,
        )

    def states(self) -> list[tuple[str, int, str, str]]:
        """(name, port, reported state, goal state) of each data node, as the monitor sees them."""
        with self.monitor_connect() as conn:
            rows = conn.execute(
                "SELECT nodename, nodeport, reportedstate::text, goalstate::text "
                "FROM pgautofailover.node ORDER BY nodeid"
            ).fetchall()
        return [(str(r[0]), int(r[1]), str(r[2]), str(r[3])) for r in rows]

    def _wait(self, what: str, timeout: float, check: Callable[[], bool]) -> None:
        """Poll ``check()`` until it returns true; ClusterError with the logs after ``timeout``."""
        last: object = None

        def reached() -> bool:
            nonlocal last
            for node in (self.monitor, *self.nodes):
                if node.keeper is not None and node is not self.killed and node.keeper.poll() is not None:
                    raise ClusterError(
                        f"pg_autoctl for {node.name} exited ({node.keeper.returncode}) while waiting for "
                        f"{what}{self._logs()}"
                    )
            try:
                done = bool(check())
                last = None
                return done
            except (psycopg.Error, ClusterError) as exc:
                last = exc
                return False

        if wait_until(reached, timeout, interval=0.2):
            return
        states: object
        try:
            states = self.states()
        except psycopg.Error as exc:
            states = exc
        raise ClusterError(
            f"{what}: not reached in {timeout:.0f}s (last error: {last}; monitor: {states}){self._logs()}"
        )

    def _wait_states(self, wanted: dict[str, str], timeout: float) -> None:
        def reached() -> bool:
            current = {name: (rep, goal) for name, _port, rep, goal in self.states()}
            return all(current.get(name) == (state, state) for name, state in wanted.items())

        self._wait(f"node states {wanted}", timeout, reached)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self, timeout: float = 180) -> float:
        """Start monitor, primary (node1) and synchronous standby (node2); returns seconds taken."""
        began = time.monotonic()
        deadline = began + timeout

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        ensure_debian_package(
            AUTO_FAILOVER_PACKAGE,
            ["pg_autoctl", BIN.parent / "lib" / "pgautofailover.so"],
            timeout=left(),
        )
        common = ["--pgctl", str(BIN / "pg_ctl"), "--hostname", "127.0.0.1", "--listen", "127.0.0.1"]
        common += ["--auth", "trust", "--no-ssl", "--ssl-mode", "disable", "--run"]
        monitor_args = ["create", "monitor", "--pgdata", str(self.monitor.pgdata)]
        self._spawn_keeper(self.monitor, [*monitor_args, "--pgport", str(self.monitor.port), *common])

        def monitor_ready() -> bool:
            with self.monitor_connect() as conn:
                row = conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'pgautofailover'")
                return row.fetchone() == (1,)

        self._wait("monitor ready", left(), monitor_ready)
        if self.fast_timings:
            with self.monitor_connect() as conn:
                for name, value in FAST_MONITOR_SETTINGS.items():
                    conn.execute(f"ALTER SYSTEM SET {name} = {value}")
                conn.execute("SELECT pg_reload_conf()")

        for node, state in zip(self.nodes, ("single", "secondary"), strict=True):
            node_args = ["create", "postgres", "--pgdata", str(node.pgdata), "--pgport", str(node.port)]
            node_args += ["--pghost", str(self.root), "--name", node.name, "--dbname", self.dbname]
            node_args += ["--formation", FORMATION, "--monitor", self.monitor_uri()]
            node_args += ["--candidate-priority", "50", "--replication-quorum", "true"]
            self._spawn_keeper(node, [*node_args, *common])
            if state == "single":
                self._wait_states({node.name: "single"}, left())
                # pg_basebackup (which pg_autoctl runs without --checkpoint=fast) waits for a
                # *spread* checkpoint: with the new database's pages dirty that took ~95 s.
                # An immediate checkpoint now leaves it next to nothing to write.
                with self.connect(node.port, dbname="postgres") as conn:
                    conn.execute("CHECKPOINT")
        self._wait_states({"node1": "primary", "node2": "secondary"}, left())
        if self.fast_timings:
            for node in self.nodes:
                for key, value in FAST_KEEPER_SETTINGS.items():
                    # writes the keeper's pg_autoctl.cfg and SIGHUPs the running keeper
                    self._run(
                        ["config", "set", "--pgdata", str(node.pgdata), key, value], f"config set {key}"
                    )
        self.set_synchronous(True, timeout=left())
        self._ensure_database(left())
        return time.monotonic() - began

    def _ensure_database(self, timeout: float) -> None:
        """``--dbname`` makes pg_autoctl create the database on the primary; check it (create it
        if an older pg_autoctl did not), add the failover probe table, wait for both on the standby."""
        _host, port = self.primary()
        with self.connect(port, dbname="postgres") as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [self.dbname]).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{self.dbname}"')
        with self.connect(port) as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS hacluster_probe "
                "(id bigserial PRIMARY KEY, port int NOT NULL, at timestamptz NOT NULL DEFAULT now())"
            )
        standby = next(n for n in self.nodes if n.port != port)

        def replicated() -> bool:
            with self.connect(standby.port) as conn:
                return conn.execute("SELECT to_regclass('hacluster_probe') IS NOT NULL").fetchone() == (True,)

        self._wait(f"database {self.dbname} replicated to {standby.name}", timeout, replicated)

    def stop(self) -> None:
        """Stop every keeper and server and remove the directory. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        keepers = [n.keeper for n in (*self.nodes, self.monitor) if n.keeper is not None]
        for keeper in keepers:  # SIGQUIT: pg_autoctl stops Postgres in immediate mode
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(keeper.pid, signal.SIGQUIT)
        deadline = time.monotonic() + 10
        for keeper in keepers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                keeper.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(keeper.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                keeper.wait(timeout=5)
        for node in (*self.nodes, self.monitor):
            node.keeper = None
            _sigkill_postmaster(node.pgdata)  # a postmaster that outlived its keeper
        shutil.rmtree(self.root, ignore_errors=True)
        atexit.unregister(self.stop)

    # -- what tests use -----------------------------------------------------------------

    def primary(self) -> tuple[str, int]:
        """(host, port) of the node the monitor currently holds as the writable primary."""
        states = self.states()
        writable = [
            port for _n, port, rep, goal in states if rep in WRITABLE_STATES and goal in WRITABLE_STATES
        ]
        if len(writable) != 1:
            raise ClusterError(f"no single writable primary right now: {states}")
        return "127.0.0.1", writable[0]

    def standby(self) -> tuple[str, int]:
        """(host, port) of the healthy standby (reported and goal state ``secondary``)."""
        ports = [port for _n, port, rep, goal in self.states() if rep == goal == "secondary"]
        if len(ports) != 1:
            raise ClusterError(f"no single healthy standby right now: {self.states()}")
        return "127.0.0.1", ports[0]

    def dsn_multi(self, *, dbname: str | None = None) -> str:
        """libpq conninfo listing both data nodes; libpq connects to whichever accepts writes."""
        hosts = ",".join("127.0.0.1" for _ in self.nodes)
        ports = ",".join(str(n.port) for n in self.nodes)
        return (
            f"host={hosts} port={ports} dbname={dbname or self.dbname} user=postgres "
            "target_session_attrs=read-write connect_timeout=2"
        )

    def url_multi(self, *, dbname: str | None = None) -> str:
        """The same as a URI (libpq/psycopg accept it; dj-database-url 3.1 does not parse it)."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)
        return f"postgresql://postgres@{hosts}/{dbname or self.dbname}?target_session_attrs=read-write&connect_timeout=2"

    def django_database(self, *, dbname: str | None = None) -> dict[str, Any]:
        """A Django ``DATABASES`` entry for the multi-host form (Django passes HOST, PORT and
        OPTIONS through to psycopg.connect unchanged, so libpq picks the read-write node)."""
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": dbname or self.dbname,
            "USER": "postgres",
            "HOST": ",".join("127.0.0.1" for _ in self.nodes),
            "PORT": ",".join(str(n.port) for n in self.nodes),
            "OPTIONS": {"target_session_attrs": "read-write", "connect_timeout": 2},
            "CONN_MAX_AGE": 0,
        }

    def kill_primary(self) -> tuple[str, int]:
        """SIGKILL the primary's keeper (its whole process group) and its postmaster + children.

        The keeper goes too because pg_autoctl supervises Postgres and would restart it within a
        second, so the monitor would never see a dead primary: this models the node (machine)
        dying, the case automatic failover exists for. Returns the killed (host, port).
        """
        host, port = self.primary()
        node = self._node(port)
        self.killed, self.killed_at = node, time.monotonic()
        postmaster = _postmaster_pid(node.pgdata)
        # collected first: once the postmaster is dead its children belong to init. They are
        # not in the keeper's process group (each backend calls setsid()).
        server = [postmaster, *_process_children(postmaster)] if postmaster is not None else []
        if node.keeper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.keeper.pid, signal.SIGKILL)  # keeper, its services, the postmaster
            node.keeper.wait(timeout=10)
        for pid in server:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return host, port

    @contextlib.contextmanager
    def paused_standby(self) -> Iterator[tuple[str, int]]:
        """SIGSTOP the standby's postmaster and all its processes (walreceiver included) for the
        duration of the block, so it acknowledges nothing; SIGCONT afterwards, even on error."""
        _host, port = self.standby()
        node = self._node(port)
        postmaster = _postmaster_pid(node.pgdata)
        if postmaster is None:
            raise ClusterError(f"{node.name} has no running postmaster{self._logs()}")
        frozen = [postmaster, *_process_children(postmaster)]
        try:
            for pid in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            yield "127.0.0.1", port
        finally:
            for pid in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def write_probe(self) -> int:
        """INSERT one row through the multi-host DSN; returns the port that took it.

        A commit whose synchronous-replication wait was cancelled is not an accepted write:
        PostgreSQL reports it with a WARNING, so any warning makes this raise.
        """
        warnings: list[str] = []
        with psycopg.connect(self.dsn_multi(), autocommit=True, options="-c statement_timeout=5000") as conn:
            conn.add_notice_handler(lambda diag: warnings.append(diag.message_primary or ""))
            conn.execute("INSERT INTO hacluster_probe (port) VALUES (inet_server_port())")
            port = conn.info.port
        if warnings:
            raise ClusterError(f"write on port {port} was not accepted cleanly: {warnings}")
        return port

    def wait_for_failover(self, timeout: float = 60) -> float:
        """Seconds from :meth:`kill_primary` until a write through the multi-host DSN succeeded
        on the other node (polled every 0.1 s). Returns once the monitor also reports the new
        primary (its keeper reports the state a moment after Postgres accepts writes), so that
        :meth:`primary` answers right after."""
        killed, killed_at = self.killed, self.killed_at
        if killed is None or killed_at is None:
            raise ClusterError("wait_for_failover() needs kill_primary() first")
        deadline = time.monotonic() + timeout
        last: object = None

        def written_elsewhere() -> float | None:
            nonlocal last
            try:
                if self.write_probe() != killed.port:
                    return time.monotonic() - killed_at
            except (psycopg.Error, ClusterError) as exc:
                last = exc
            return None

        seconds = wait_until(written_elsewhere, timeout, interval=0.1)
        if seconds:
            left = max(1.0, deadline - time.monotonic())
            self._wait("monitor reports the new primary", left, lambda: self.primary()[1] != killed.port)
            return seconds
        raise ClusterError(
            f"no write accepted {timeout}s after killing {killed.name} (last error: {last}; "
            f"monitor: {self.states()}){self._logs()}"
        )

    def set_synchronous(self, enabled: bool, *, timeout: float = 30) -> None:
        """Make commits on the primary wait for the standby (True) or not (False), and wait until
        the primary's ``synchronous_standby_names`` and ``pg_stat_replication.sync_state`` agree."""
        with self.monitor_connect() as conn:
            # 0 is the only value pg_auto_failover accepts with one standby (it needs
            # number_sync_standbys + 1 quorum standbys); sync vs async is the standby's quorum flag.
            (current,) = conn.execute(
                "SELECT number_sync_standbys FROM pgautofailover.formation WHERE formationid = %s",
                [FORMATION],
            ).fetchone() or (None,)
            if current != 0:
                conn.execute("SELECT pgautofailover.set_formation_number_sync_standbys(%s, 0)", [FORMATION])
            _host, primary_port = self.primary()
            for node in self.nodes:
                if node.port == primary_port or node is self.killed:
                    continue
                quorum = conn.execute(
                    "SELECT replicationquorum FROM pgautofailover.node WHERE nodename = %s", [node.name]
                ).fetchone()
                if quorum != (enabled,):  # setting it again would still cycle the primary via apply_settings
                    conn.execute(
                        "SELECT pgautofailover.set_node_replication_quorum(%s, %s, %s)",
                        [FORMATION, node.name, enabled],
                    )

        def applied() -> bool:
            _host, port = self.primary()
            with self.connect(port, dbname="postgres") as conn:
                names = conn.execute("SHOW synchronous_standby_names").fetchone()
                modes = [r[0] for r in conn.execute("SELECT sync_state FROM pg_stat_replication").fetchall()]
            if enabled:
                return bool(names and names[0]) and modes == ["quorum"]
            return names == ("",) and modes == ["async"]

        self._wait(f"synchronous replication {'on' if enabled else 'off'}", timeout, applied)

    def replication(self) -> tuple[str, list[tuple[str, str, str]]]:
        """The primary's ``synchronous_standby_names`` and (application_name, state, sync_state) rows."""
        _host, port = self.primary()
        with self.connect(port, dbname="postgres") as conn:
            row = conn.execute("SHOW synchronous_standby_names").fetchone()
            rows = conn.execute(
                "SELECT application_name, state, sync_state FROM pg_stat_replication ORDER BY 1"
            ).fetchall()
        return (str(row[0]) if row else ""), [(str(a), str(b), str(c)) for a, b, c in rows]


def _measure() -> None:
    parser = argparse.ArgumentParser(description="Measure HaCluster start and failover times.")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--default-timings", action="store_true", help="pg_auto_failover's own timeouts")
    args = parser.parse_args()
    for run in range(1, args.runs + 1):
        cluster = HaCluster(dbname="zl_ha_measure", fast_timings=not args.default_timings)
        try:
            started = cluster.start()
            cluster.write_probe()
            cluster.kill_primary()
            failover = cluster.wait_for_failover(timeout=180)
        finally:
            stopping = time.monotonic()
            cluster.stop()
        print(
            f"run {run}: start {started:.1f}s, failover (kill -> write accepted) {failover:.1f}s, "
            f"stop {time.monotonic() - stopping:.1f}s",
            flush=True,
        )


if __name__ == "__main__":
    _measure()
