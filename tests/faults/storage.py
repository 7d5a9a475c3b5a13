"""Storage faults (issue 51): the filesystem under the ledger fills, then space is freed.

- :class:`LoopFs`: a small ext4 filesystem in a sparse file, loop-mounted (root), that
  :meth:`LoopFs.hold_full` keeps full for a while (a filler file topped up every 0.2 s, so the
  space the server frees meanwhile is taken again) and then frees. Unmounted (and its loop
  device detached) by :meth:`LoopFs.unmount`, at interpreter exit whatever happened;
- :class:`StorageCluster`: the fault suite's private PostgreSQL with its data directory on a
  :class:`LoopFs` (``pg_wal`` stays on the ordinary disk: PostgreSQL then refuses what needs a
  new data page, ``could not extend file``, SQLSTATE 53100, and keeps running);
- :func:`run_storage`: the workload (a producer sending in transactions, two workers with the
  plain and the transactional handler, each running the sweep and the scheduler, and a
  ``zeroloss_sweep --loop``) while the filesystem is held full, on PostgreSQL (``disk-full``)
  or on SQLite with its file on the loop filesystem (``sqlite-full``).

What it measures besides the checker's findings (:class:`StorageRun`): how each refused send
failed (its exception class) and how long it took; the seconds from the space being freed to
the first acknowledgement *and* the first accepted send after it (processing resumed); what
the health report and ``zeroloss_status`` said while the disk was full and after; how many
storage-fault lines each worker logged.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.support.waiting import pause, wait_until
from zeroloss.core.outage import COMMIT_STALL_QUIET, COMMIT_STALL_S, STORAGE_FAULT_QUIET, is_storage_fault

from .checker import Checker, read_sends
from .cluster import FaultCluster
from .injector import Fault
from .stallfs import StallFs
from .workload import ROOT, Proc, WorkerPool, child_env, producer, sweeper
from .zeroloss_handlers import EFFECT_TABLE

#: The documented exceptions of a refused ``send()`` (docs/guarantees.md, "The disk fills"):
#: StorageFull for a disk that refuses the write, Django's errors for an unreachable database
#: (and for the caller's own connect or COMMIT, logged ``caller:...`` by the producer).
DOCUMENTED_SEND_ERRORS = {
    "zeroloss.exceptions.StorageFull",
    "django.db.utils.OperationalError",
    "django.db.utils.InterfaceError",
}
#: The longest a refused ``send()`` may take during a storage fault (docs/guarantees.md).
SEND_REFUSAL_BOUND_S = 5.0
#: Processing resumes within this many seconds of the space being freed (the issue's target).
RESUME_TARGET_S = 5.0
FILLER = ".zl-filler"
#: The fault starts a third of the way into the sending, at most this many seconds in.
FAULT_AT_MOST_S = 10.0
#: Each fsync's delay in the fsync-stalls scenario (seconds).
STALLS_DELAY_S = 5.0
#: A send() during a stall returns when the fsyncs queued ahead of it do: at the latest by the
#: stall's end (docs/guarantees.md, "The disk stalls"), plus this much slack.
STALLED_SEND_SLACK_S = 2.0


class StorageError(RuntimeError):
    """The loop filesystem could not be set up (the message says what is missing)."""


def _run(cmd: list[str], timeout: float = 60) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise StorageError(f"`{' '.join(cmd)}` did not finish in {timeout}s") from exc
    if done.returncode != 0:
        raise StorageError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


class LoopFs:
    """An ext4 filesystem of ``size_mb`` in ``<root>/<name>.img`` mounted on ``<root>/<name>``."""

    def __init__(self, root: Path, name: str, size_mb: int, *, owner: str | None = "postgres") -> None:
        if os.geteuid() != 0:
            raise StorageError("loop-mounting a filesystem needs root (run the fault suite as root)")
        for tool in ("mkfs.ext4", "mount", "umount", "losetup"):
            if shutil.which(tool) is None:
                raise StorageError(f"{tool} not found (Debian: apt-get install e2fsprogs mount)")
        self.image = root / f"{name}.img"
        self.mountpoint = root / name
        self.size_mb = size_mb
        self.owner = owner
        self.mounted = False
        self._lock = threading.Lock()

    def mount(self) -> None:
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as image:
            image.truncate(self.size_mb * 1024 * 1024)  # sparse: costs what is written only
        # -m 0: no blocks reserved for root, so the filler (root) and the server see one limit
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", str(self.image)])
        atexit.register(self.unmount)
        _run(["mount", "-o", "loop", str(self.image), str(self.mountpoint)])
        self.mounted = True
        if self.owner:
            shutil.chown(self.mountpoint, self.owner, self.owner)
        os.chmod(self.mountpoint, 0o700)

    def free_bytes(self) -> int:
        st = os.statvfs(self.mountpoint)
        return st.f_bavail * st.f_frsize

    def fill(self) -> int:
        """Write the filler until the filesystem refuses (ENOSPC); returns the bytes added."""
        written = 0
        with self._lock:
            fd = os.open(self.mountpoint / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                for chunk in (1 << 20, 1 << 12):
                    block = b"\0" * chunk
                    while True:
                        try:
                            written += os.write(fd, block)
                        except OSError as exc:
                            if exc.errno != errno.ENOSPC:
                                raise
                            break
                with contextlib.suppress(OSError):
                    os.fsync(fd)
            finally:
                os.close(fd)
        return written

    def free(self) -> None:
        """Remove the filler; its blocks are reusable once the journal has committed the unlink."""
        with self._lock:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.mountpoint / FILLER)
            _run(["sync", "--file-system", str(self.mountpoint)])

    def hold_full(
        self, seconds: float, stop: threading.Event, *, tick: Callable[[], None] | None = None
    ) -> tuple[float, float]:
        """Full for ``seconds`` (less if ``stop`` is set), topping up every 0.2 s (and calling
        ``tick`` then), then freed, and ``tick`` called once more.

        Returns (full since, freed at) as wall-clock times."""
        self.fill()
        began = time.time()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not pause(stop, min(0.2, deadline - time.monotonic())):
            self.fill()  # what the server freed (a temporary file, a recycled segment) is taken again
            if tick is not None:
                tick()
        self.free()
        freed = time.time()
        if tick is not None:
            tick()
        return began, freed

    def unmount(self) -> None:
        if self.mounted:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.mountpoint / FILLER)
            try:
                _run(["umount", str(self.mountpoint)])
            except StorageError:
                _run(["umount", "--lazy", str(self.mountpoint)])  # a process still has a file open
            self.mounted = False
        # mount -o loop sets autoclear; detach what is left anyway (a lazy unmount, a crash)
        for line in _run(["losetup", "--associated", str(self.image)]).splitlines():
            device = line.split(":", 1)[0]
            with contextlib.suppress(StorageError):
                _run(["losetup", "--detach", device])
        atexit.unregister(self.unmount)


class StorageCluster(FaultCluster):
    """The fault suite's PostgreSQL with its data directory (``disk="data"``; ``pg_wal`` stays on
    the ordinary disk) or its ``pg_wal`` (``disk="wal"``, 1 MB segments, no checkpoint but the
    harness's) on a loop filesystem of ``size_mb``.

    A full ``pg_wal`` makes PostgreSQL PANIC when it needs a new segment; its postmaster then
    restarts into crash recovery, which may fail again and stop it: :meth:`supervise`, called
    while the disk is full, starts it again when it is down (as systemd's ``Restart=`` would)."""

    def __init__(self, disk: str = "data", size_mb: int = 160) -> None:
        super().__init__()
        if disk not in ("data", "wal"):
            raise ValueError(f"disk must be data or wal, not {disk!r}")
        self.disk = disk
        self.fs = LoopFs(self.root, f"{disk}fs", size_mb)
        # initdb wants empty directories: a mount point has lost+found
        if disk == "data":
            self.primary_dir = self.fs.mountpoint / "pgdata"
            self.wal_dir = self.root / "pg_wal"
        else:
            self.wal_dir = self.fs.mountpoint / "pg_wal"
        self.restarts = 0
        self.crashes = 0
        #: wal-full: when the server accepted connections again after the space was freed.
        self.up_again: float | None = None

    def start(self) -> None:
        try:
            self.fs.mount()
            self.initdb_extra = ("--waldir", str(self.wal_dir))
            if self.disk == "wal":
                self.initdb_extra += ("--wal-segsize", "1")
            super().start()
            with self.connect(dbname="postgres") as conn:
                # what the fault suite's cluster leaves to its defaults, kept small for the small disk
                conn.execute("ALTER SYSTEM SET max_wal_size = '256MB'")
                conn.execute("ALTER SYSTEM SET wal_keep_size = 0")
                if self.disk == "wal":
                    # segments are then only recycled by the harness's CHECKPOINT before the fill
                    conn.execute("ALTER SYSTEM SET min_wal_size = '2MB'")
                    conn.execute("ALTER SYSTEM SET checkpoint_timeout = '1h'")
                conn.execute("SELECT pg_reload_conf()")
        except BaseException:
            self.stop()
            raise

    def prepare_template(self) -> None:
        _prepare_template_from_dump(self)

    def running(self) -> bool:
        done = subprocess.run(
            [*_pg_as_postgres(), str(_pg_bin() / "pg_ctl"), "status", "-D", str(self.primary_dir)],
            capture_output=True,
            timeout=30,
        )
        return done.returncode == 0

    def accepting_again(self, dbname: str, timeout: float = 60) -> float | None:
        """When the server (started again if it stopped) first accepted a connection; None: not in time."""

        def accepts() -> float | None:
            self.supervise()
            try:
                with psycopg.connect(self.url(dbname=dbname), connect_timeout=2):
                    return time.time()
            except psycopg.Error:
                return None

        return wait_until(accepts, timeout, interval=0.05)

    def supervise(self) -> None:
        """Start the server again if it stopped (a failed crash recovery); count it."""
        if not self.running():
            self.crashes += 1
            self._started.discard(self.primary_dir)
            with contextlib.suppress(Exception):
                self.start_server()
                self.restarts += 1

    def push_wal(self, dbname: str) -> None:
        """Make the server need a new WAL segment now (a full ``pg_wal`` then PANICs)."""
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.url(dbname=dbname), autocommit=True, connect_timeout=2) as conn,
        ):
            conn.execute("SELECT pg_switch_wal()")

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.fs.unmount()


class StallCluster(FaultCluster):
    """The fault suite's PostgreSQL with its ``pg_wal`` on a FUSE passthrough whose ``fsync``
    stalls on command (:mod:`.stallfs`): every commit waits for its WAL's fsync."""

    def __init__(self) -> None:
        super().__init__()
        backing = self.root / "walback"
        self.stall = StallFs(
            backing, self.root / "walfuse", self.root / "stall.ctl", self.root / "stallfs.log"
        )
        self.wal_dir = self.stall.mountpoint / "pg_wal"

    def start(self) -> None:
        try:
            self.stall.backing.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                shutil.chown(self.stall.backing, "postgres", "postgres")
            self.stall.mount()
            self.initdb_extra = ("--waldir", str(self.wal_dir))
            super().start()
        except BaseException:
            self.stop()
            raise

    def prepare_template(self) -> None:
        _prepare_template_from_dump(self)

    def stop(self) -> None:
        self.stall.clear()
        for datadir in (self.standby_dir, self.primary_dir):
            with contextlib.suppress(Exception):
                self._pg_ctl_stop(datadir, mode="immediate")
        try:
            self.stall.unmount()
        finally:
            super().stop()


#: The storage clusters' migrated template database, dumped by the first (migrating a
#: database costs about 10 s on a loaded host; loading the dump, about 1 s).
_TEMPLATE_DUMP: list[str] = []


def _prepare_template_from_dump(cluster: FaultCluster) -> None:
    if not _TEMPLATE_DUMP:
        FaultCluster.prepare_template(cluster)
        dumped = subprocess.run(
            [str(_pg_bin() / "pg_dump"), "--no-owner", "--dbname", cluster.url()],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if dumped.returncode != 0:
            raise StorageError(f"pg_dump failed: {dumped.stderr.strip()}")
        _TEMPLATE_DUMP.append(dumped.stdout)
        return
    loaded = subprocess.run(
        [str(_pg_bin() / "psql"), "--quiet", "--set", "ON_ERROR_STOP=1", "--dbname", cluster.url()],
        input=_TEMPLATE_DUMP[0],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if loaded.returncode != 0:
        raise StorageError(f"loading the template's dump failed: {loaded.stderr.strip()[-2000:]}")


def _pg_bin() -> Path:
    from tests.infra.pgcluster import BIN

    return BIN


def _pg_as_postgres() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


# -- the run ------------------------------------------------------------------------------------


@dataclass
class StorageRun:
    scenario: str
    seed: int
    findings: Any
    fault: Fault
    wall_s: float
    run_dir: Path
    refused_errors: Counter[str] = field(default_factory=Counter)
    max_refusal_s: float = 0.0
    #: The longest call of send(), accepted or refused (a stalled commit makes it wait).
    max_send_s: float = 0.0
    #: A stall: how long after its end the last send() begun during it returned (bound:
    #: STALLED_SEND_SLACK_S).
    send_past_end_s: float | None = None
    #: wal-full: seconds from the space being freed to the server accepting connections again
    #: (its crash recovery); resumption is then measured from there.
    up_again_s: float | None = None
    #: wal-full: seconds from the space being freed to processing resumed (the server's
    #: restart included; resume_s counts from it accepting connections again).
    resume_from_freed_s: float | None = None
    resume_ack_s: float | None = None
    resume_send_s: float | None = None
    during: list[dict[str, Any]] = field(default_factory=list)
    after: dict[str, Any] = field(default_factory=dict)
    fault_lines: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    #: wal-full: PANICs in the server's log, and times the harness found the server stopped.
    server_panics: int = 0
    server_crashes: int = 0
    server_restarts: int = 0

    @property
    def resume_s(self) -> float | None:
        if self.resume_ack_s is None or self.resume_send_s is None:
            return None
        return max(self.resume_ack_s, self.resume_send_s)

    @property
    def ok(self) -> bool:
        return not self.findings.violations and not self.problems

    @property
    def runs_during(self) -> int:
        """Handler runs that started while the fault lasted."""
        return sum(self.fault.began <= at <= self.fault.ended for at in self.findings.run_starts)

    @property
    def runs_after(self) -> int:
        """Handler runs that started within RUNS_AFTER_S of the fault's end."""
        end = self.fault.ended
        return sum(end < at <= end + RUNS_AFTER_S for at in self.findings.run_starts)


#: The prober's process: Django set up before this module is imported (its imports reach the
#: models through tests.faults.zeroloss_handlers).
PROBER_MAIN = (
    "import os, django; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'project.settings'); "
    "django.setup(); from tests.faults.storage import _serve_probes; _serve_probes()"
)


class Prober:
    """A process that has Django loaded and waits: each :meth:`probe` makes it read what the
    health report (uncached) and ``zeroloss_status --json --no-cache`` say now, so that no
    process start (seconds on a loaded host) eats into the fault."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self._err = open(log, "ab")  # noqa: SIM115 - closed by close()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", PROBER_MAIN],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )
        ready = self.proc.stdout.readline() if self.proc.stdout else ""
        if ready.strip() != "ready":
            raise RuntimeError(f"the health prober did not start: {ready!r} (see {log})")

    def probe(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("probe\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the health prober exited")
        return dict(json.loads(line))

    def send(self, message_id: str) -> dict[str, Any]:
        """``zeroloss.send()`` one message (autocommit) in the prober: {"error", "storage", "took"}."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"send {message_id}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the health prober exited")
        return dict(json.loads(line))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._err.close()


def _serve_probes() -> None:
    """The prober's side: one JSON line per line read (:data:`PROBER_MAIN`):
    ``send ID`` sends a message, anything else probes."""
    import io

    from django.core.management import call_command

    from zeroloss.ops.health import health_report
    from zeroloss.runtime.transports import send

    print("ready", flush=True)
    from django.db import close_old_connections

    for line in sys.stdin:
        close_old_connections()  # as at a request's start: a connection a crash broke is dropped
        began = time.time()
        command, _, message_id = line.strip().partition(" ")
        if command == "send":
            error = ""
            try:
                send("faults.plain", {"n": 0, "probe": True}, message_id=message_id)
            except Exception as exc:
                error = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
            storage = bool(error) and is_storage_fault(Exception(error))
            print(json.dumps({"error": error, "storage": storage, "took": time.time() - began}), flush=True)
            continue
        health = json.dumps(health_report(use_cache=False).as_dict())
        status = io.StringIO()
        try:
            call_command("zeroloss_status", "--json", "--no-cache", stdout=status)
        except BaseException as exc:
            status.write(f"{type(exc).__name__}: {exc}")
        out = {"health": health, "status": status.getvalue(), "began": began, "done_at": time.time()}
        print(json.dumps(out), flush=True)


def _first_after(url: str, after: float, timeout: float) -> tuple[float | None, float | None]:
    """Seconds from ``after`` to the first acknowledgement and to the first persisted message."""

    def query() -> tuple[float | None, float | None]:
        sql = (
            "SELECT min({at}) FILTER (WHERE reason = 'acknowledged'), "
            "min({at}) FILTER (WHERE reason = 'persisted') FROM zeroloss_messageevent WHERE created_at > {after}"
        )
        if url.startswith("sqlite"):
            path = url.removeprefix("sqlite:///")
            with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
                row = conn.execute(
                    sql.format(
                        at="(julianday(created_at) - 2440587.5) * 86400.0",
                        after="strftime('%Y-%m-%d %H:%M:%f', ?, 'unixepoch')",
                    ),
                    [after],
                ).fetchone()
        else:
            with psycopg.connect(url, autocommit=True, connect_timeout=5) as pconn:
                row = pconn.execute(
                    sql.format(at="extract(epoch FROM created_at)::float8", after="to_timestamp(%s)"), [after]
                ).fetchone()
        return (row[0], row[1]) if row else (None, None)

    found: list[tuple[float | None, float | None]] = []

    def both() -> bool:
        with contextlib.suppress(psycopg.Error, sqlite3.Error):
            found[:] = [query()]
        return bool(found) and found[0][0] is not None and found[0][1] is not None

    wait_until(both, timeout, interval=0.2)
    ack, sent = found[0] if found else (None, None)
    return (None if ack is None else round(ack - after, 2)), (
        None if sent is None else round(sent - after, 2)
    )


def _fault_lines(pool: WorkerPool) -> dict[str, list[str]]:
    lines: dict[str, list[str]] = {}
    for g in pool.generations:
        text = g.log.read_text(errors="replace") if g.log.exists() else ""
        lines[f"w{g.slot}g{g.number}"] = [
            line.strip() for line in text.splitlines() if "storage" in line or "reachable" in line
        ]
    return lines


def _faults_ended(pool: WorkerPool) -> bool:
    """Every worker that logged a fault's start (a storage fault, a stall) logged its end."""
    return all(
        sum("since" in line for line in lines) <= sum("again" in line for line in lines)
        for lines in _fault_lines(pool).values()
    )


def run_storage(
    *,
    scenario: str,
    database_url: str,
    fs: LoopFs | None,
    full_s: float,
    seed: int,
    run_dir: Path,
    messages: int,
    duration: float,
    ack_timeout: float = 2.0,
    log: Callable[[str], None] = print,
    before_fill: Callable[[], None] | None = None,
    tick: Callable[[], None] | None = None,
    server: FaultCluster | None = None,
    hold: Callable[[threading.Event], tuple[float, float]] | None = None,
) -> StorageRun:
    """The workload with ``fs`` held full for ``full_s`` seconds from about a third of ``duration``
    (``before_fill`` called just before, ``tick`` every 0.2 s while it is full and once after)."""
    started = time.monotonic()
    run_dir.mkdir(parents=True, exist_ok=True)
    env = child_env(database_url, run_dir, ZEROLOSS_ACK_TIMEOUT=str(ack_timeout), ZEROLOSS_SWEEP_INTERVAL="2")
    env["ZEROLOSS_LOG_LEVEL"] = "WARNING"
    pool = WorkerPool("zeroloss", 2, env, run_dir, concurrency=2)
    sweep_proc: Proc | None = None
    producer_proc: Proc | None = None
    prober: Prober | None = None
    stop = threading.Event()
    try:
        pool.start()
        prober = Prober(env, run_dir / "prober.log")
        sweep_proc = sweeper(env, run_dir, interval=1.0)
        producer_proc = producer(
            env,
            run_dir,
            {
                "seed": seed,
                "prefix": "s",
                "count": messages,
                "rate": messages / duration,
                "queues": ["faults.tx", "faults.plain"],
                "max_attempts": 100,
                "sleep_ms_max": 30.0,
                "slow_every": 25,
                "out": str(run_dir / "sends.log"),
                "give_up_after": 120,
                "in_transaction": True,
            },
        )
        wait_until(
            lambda: (run_dir / "sends.log").exists() and (run_dir / "sends.log").stat().st_size > 0, 90
        )
        pause(stop, min(duration / 3, FAULT_AT_MOST_S))
        if hold is None:
            assert fs is not None
            log(f"  {scenario}: filling {fs.mountpoint} ({fs.free_bytes() >> 20} MiB free) for {full_s:.0f}s")
            hold = functools.partial(fs.hold_full, full_s, tick=tick)
        if before_fill is not None:
            before_fill()
        holder_result: list[tuple[float, float]] = []
        holder = threading.Thread(target=lambda: holder_result.append(hold(stop)), daemon=True)
        holder.start()
        # every second while it is full: a PANICking server is down, then up, then down again
        probes: list[dict[str, Any]] = []
        while not pause(stop, 1.0) and holder.is_alive():
            probes.append(prober.probe())
        holder.join(timeout=full_s + 60)
        if not holder_result:
            raise RuntimeError(f"{scenario}: the fault did not end within {full_s + 60:.0f}s")
        began, freed = holder_result[0]
        log(f"  {scenario}: fault {began:.1f} .. {freed:.1f} ({freed - began:.1f}s)")
        # (a probe begun while the filler was still filling is not during the fault)
        during = [p for p in probes if began <= p["began"] and p["done_at"] < freed]
        if not during:
            raise RuntimeError(f"{scenario}: no health and status probe ended during the fault")
        log(f"  {scenario}: {len(during)} health and status probes during the fault")
        resume_ack, resume_send = _first_after(database_url, freed, 60)
        wait_until(lambda: not producer_proc.alive, duration + 180, interval=0.5)
        if producer_proc.alive:
            producer_proc.terminate(timeout=30)
        done = _drained(database_url, 120)
        # a storage fault ends STORAGE_FAULT_QUIET after its last refusal, a stall
        # COMMIT_STALL_QUIET after its last slow commit: each worker logs it then
        wait_until(
            lambda: _faults_ended(pool), max(COMMIT_STALL_QUIET, STORAGE_FAULT_QUIET) + 30, interval=0.5
        )
        after = prober.probe()
        pool.shutdown()
        sweep_exit = sweep_proc.terminate()
        fault = Fault(scenario, began, freed, detail={"full_s": round(freed - began, 1)})
        findings = Checker(
            seed=seed,
            database_url=database_url,
            run_dir=run_dir,
            faults=[fault],
            generations=pool.generations,
        ).check()
        run = StorageRun(
            scenario,
            seed,
            findings,
            fault,
            round(time.monotonic() - started, 1),
            run_dir,
            resume_ack_s=resume_ack,
            resume_send_s=resume_send,
            during=during,
            after=after,
            fault_lines=_fault_lines(pool),
        )
        if isinstance(server, StorageCluster) and server.disk == "wal":
            run.up_again_s = None if server.up_again is None else round(server.up_again - freed, 2)
            if server.up_again is not None:
                # as for a restart (docs/guarantees.md, "Recovery time after a restart"): from
                # the server accepting connections again, once it was freed
                run.resume_from_freed_s = run.resume_s
                run.resume_ack_s, run.resume_send_s = _first_after(database_url, server.up_again, 60)
            run.server_crashes = server.crashes
            server_log = server.log_tail(1_000_000)
            run.server_panics = server_log.count("PANIC:")
            # every time it became ready again after its first start (a crash's restart, or ours)
            run.server_restarts = server_log.count("database system is ready to accept connections") - 1
        _judge(run, sweep_exit, done)
        return run
    finally:
        stop.set()
        if prober is not None:
            prober.close()
        pool.kill_all()
        for proc in (producer_proc, sweep_proc):
            if proc is not None and proc.alive:
                proc.terminate(timeout=10)
        if fs is not None:
            with contextlib.suppress(StorageError):
                fs.free()


def _unfinished(url: str) -> int:
    sql = "SELECT count(*) FROM zeroloss_message WHERE status IN ('pending', 'processing')"
    try:
        if url.startswith("sqlite"):
            with contextlib.closing(sqlite3.connect(url.removeprefix("sqlite:///"), timeout=30)) as conn:
                return int(conn.execute(sql).fetchone()[0])
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as pconn:
            row = pconn.execute(sql).fetchone()
            return int(row[0]) if row else -1
    except (psycopg.Error, sqlite3.Error):
        return -1


def _drained(url: str, timeout: float) -> bool:
    return bool(wait_until(lambda: _unfinished(url) == 0, timeout, interval=0.5))


def _reports_storage(name: str, output: str, scenario: str = "") -> bool | None:
    """Whether the health report's or zeroloss_status's output reports the storage fault (None:
    no JSON). A full ``pg_wal`` stops the server (PANIC): there, "the database cannot be
    reached" is the report."""
    try:
        data = json.loads(output)
    except ValueError:
        if scenario == "wal-full" and "could not reach the ledger" in output:
            return True
        # zeroloss_status exits 4 when it cannot even connect; its message names the disk
        if "could not reach the ledger" in output and is_storage_fault(Exception(output)):
            return True
        return None
    if name == "health":
        unreachable = scenario == "wal-full" and data["checks"]["database"]["ok"] is False
        return data["status"] == "fail" and (
            data["checks"].get("storage", {}).get("ok") is False or unreachable
        )
    return bool(data.get("storage"))


def _judge(run: StorageRun, sweep_exit: int, drained: bool) -> None:
    """The storage-specific checks, besides the checker's."""
    p = run.problems
    sends = read_sends(run.run_dir / "sends.log")
    refused = [s for s in sends if not s.accepted]
    run.refused_errors = Counter(s.error for s in refused)
    run.max_refusal_s = round(max((s.returned - s.began for s in refused), default=0.0), 2)
    run.max_send_s = round(max((s.returned - s.began for s in sends), default=0.0), 2)
    names = {e.removeprefix("caller:").removesuffix("!storage") for e in run.refused_errors}
    undocumented = names - DOCUMENTED_SEND_ERRORS
    if undocumented:
        p.append(f"send() refused with undocumented exceptions: {sorted(undocumented)}")
    # A disk that refuses the write is StorageFull from send() itself, never the raw driver error.
    raw = sorted(e for e in run.refused_errors if e.endswith("!storage") and not e.startswith("caller:"))
    if raw:
        p.append(f"send() raised a raw error for a full disk, not StorageFull: {raw}")
    # (On SQLite the refusals come at the caller's COMMIT, Django's: tests/ledger/test_storage_full.py.)
    if run.scenario == "disk-full" and not run.refused_errors["zeroloss.exceptions.StorageFull"]:
        p.append(f"no send() was refused with StorageFull during the full disk: {dict(run.refused_errors)}")
    if run.max_refusal_s > SEND_REFUSAL_BOUND_S:
        p.append(f"a refused send() took {run.max_refusal_s}s (bound {SEND_REFUSAL_BOUND_S}s)")
    if run.scenario in STALLS:
        during = [s.returned - run.fault.ended for s in sends if s.began < run.fault.ended]
        run.send_past_end_s = round(max(during, default=0.0), 2)
        if run.send_past_end_s > STALLED_SEND_SLACK_S:
            p.append(
                f"a send() begun during the stall returned {run.send_past_end_s}s after its end "
                f"(bound {STALLED_SEND_SLACK_S}s)"
            )
    if not drained:
        p.append("the ledger did not drain within 120 s of the producer's end")
    if sweep_exit not in (0, -15):
        p.append(f"zeroloss_sweep --loop exited {sweep_exit}")
    if run.resume_s is None or run.resume_s > RESUME_TARGET_S:
        p.append(
            f"processing resumed {run.resume_s}s after the space was freed (first acknowledgement "
            f"{run.resume_ack_s}s, first accepted send {run.resume_send_s}s; target {RESUME_TARGET_S}s)"
        )
    # Data or SQLite disk full: every probe reports it. pg_wal full: the server PANICs, restarts,
    # and is up (healthy) between its crashes; at least one probe must have caught it down.
    # A stall: commits are slow, not refused; the probes' own commit waits on it (any probe: one
    # may end before the first stalled fsync).
    # A stall: every probe begun COMMIT_STALL_S into it and done before its end reports it (the
    # repeated stalls end a delayed fsync before the recorded end: their last one ends then).
    stall_end = run.fault.ended - (STALLS_DELAY_S if run.scenario == "fsync-stalls" else 0.0)
    within = [
        probe
        for probe in run.during
        if probe["began"] >= run.fault.began + COMMIT_STALL_S and probe["done_at"] <= stall_end
    ]
    for name in ("health", "status"):
        seen = [_reports_storage(name, probe.get(name, ""), run.scenario) is True for probe in run.during]
        if run.scenario in STALLS and not all(
            _reports_storage(name, probe.get(name, ""), run.scenario) is True for probe in within
        ):
            p.append(f"{name} missed the stall in a probe begun {COMMIT_STALL_S}s into it")
        if not (any(seen) if run.scenario in ("wal-full", *STALLS) else all(seen)):
            p.append(
                f"{name} reported the fault in {sum(seen)} of {len(seen)} probes while it lasted: "
                f"{[probe.get(name, '')[-300:] for probe in run.during][:3]}"
            )
        if _reports_storage(name, run.after.get(name, ""), run.scenario) is not False:
            p.append(f"{name} still reported a fault after it: {run.after.get(name, '')[-600:]}")
    # A server that crashed N times is N outages (one pair of lines each), never one per attempt.
    most = 1 if run.scenario != "wal-full" else max(1, run.server_restarts)
    for worker, all_lines in run.fault_lines.items():
        # a refusal (storage fault, outage) and a stall (slow commits) each: once at start and end
        for stall in (False, True):
            lines = [
                line for line in all_lines if ("storage stalled" in line or "commits fast" in line) == stall
            ]
            starts = [line for line in lines if "since" in line]
            ends = [line for line in lines if "again" in line]
            # a worker that met no refusal (it had nothing to write meanwhile) logs nothing
            if len(starts) > (1 if stall else most) or len(ends) != len(starts):
                p.append(
                    f"{worker} logged the fault {len(starts)} time(s) at its start and {len(ends)} at its "
                    f"end (want once each): {lines[:6]}"
                )
    if not any(run.fault_lines.values()):
        # Sends are refused during a full disk, so a worker that drained the backlog before it
        # has nothing to write: in the CI profile's short fault on a busy host that happens, and
        # the check would fail the run for the host's speed. The soak's longer faults require it.
        what = "no worker met the fault: nothing was refused them, no commit stalled"
        if run.fault.ended - run.fault.began >= WORKER_MUST_MEET_FAULT_S:
            p.append(f"{what} (lengthen it)")
        else:
            print(f"  note: {what} (a {run.fault.ended - run.fault.began:.0f}s fault; the soak requires it)")
    # A claim whose commit outlasted its leases is revived, not left to the sweep unrun; a
    # sweep may still win the moment between two revivals, rarely.
    unrun = run.findings.expired_unrun
    long_stall = run.scenario in STALLS and run.fault.ended - run.fault.began >= WORKER_MUST_MEET_FAULT_S
    if long_stall and unrun > EXPIRED_UNRUN_MOST:
        p.append(
            f"{unrun} claims ran out unrun during the stall (at most {EXPIRED_UNRUN_MOST}): "
            "their workers did not revive them (docs/guarantees.md#the-disk-stalls)"
        )


def sqlite_effect_table(path: Path) -> None:
    """The transactional handler's effect table, in SQLite's dialect (cluster.py's is PostgreSQL's)."""
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {EFFECT_TABLE} (id integer PRIMARY KEY AUTOINCREMENT, "
            "message_id text NOT NULL, attempt int NOT NULL, pid int NOT NULL, token text, "
            "committed_at text NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')))"
        )
        conn.commit()


def report_line(run: StorageRun) -> str:
    f = run.findings
    return json.dumps(
        {
            "scenario": run.scenario,
            "accepted": f.accepted,
            "lost": len(f.lost),
            "refused": f.refused_sends,
            "effects_twice": f.effects_twice_count,
            "reruns": dict(f.reruns),
            "runs_during": run.runs_during,
            "runs_after": run.runs_after,
            "expired_unrun": f.expired_unrun,
            "resume_s": run.resume_s,
        }
    )


def run_disk_full(
    *,
    full_s: float,
    seed: int,
    base_dir: Path,
    messages: int,
    duration: float,
    log: Callable[[str], None] = print,
) -> StorageRun:
    """Scenario 1: PostgreSQL's data filesystem full for ``full_s`` seconds, then freed."""
    return _run_on_cluster("disk-full", "data", full_s, seed, base_dir, messages, duration, log)


def run_wal_full(
    *,
    full_s: float,
    seed: int,
    base_dir: Path,
    messages: int,
    duration: float,
    log: Callable[[str], None] = print,
) -> StorageRun:
    """Scenario 2: ``pg_wal``'s filesystem full for ``full_s`` seconds (PANIC, crash, restart,
    again), then freed."""
    return _run_on_cluster("wal-full", "wal", full_s, seed, base_dir, messages, duration, log)


def _run_on_cluster(
    scenario: str,
    disk: str,
    full_s: float,
    seed: int,
    base_dir: Path,
    messages: int,
    duration: float,
    log: Callable[[str], None],
) -> StorageRun:
    cluster = StorageCluster(disk)
    dbname = "zl_faults_storage"
    try:
        cluster.start()
        url = cluster.create_database(dbname)

        def checkpoint() -> None:  # recycled segments only up to here
            with cluster.connect(dbname="postgres") as conn:
                conn.execute("CHECKPOINT")

        def tick() -> None:
            if cluster.fs.free_bytes() > (1 << 20):  # freed: the fault is over
                cluster.up_again = cluster.accepting_again(dbname)
                return
            cluster.supervise()
            cluster.push_wal(dbname)

        return run_storage(
            scenario=scenario,
            database_url=url,
            fs=cluster.fs,
            full_s=full_s,
            seed=seed,
            run_dir=base_dir / scenario,
            messages=messages,
            duration=duration,
            log=log,
            before_fill=checkpoint if disk == "wal" else None,
            tick=tick if disk == "wal" else None,
            server=cluster,
        )
    finally:
        cluster.stop()


def run_fsync_stalls(
    *,
    full_s: float,
    seed: int,
    base_dir: Path,
    messages: int,
    duration: float,
    log: Callable[[str], None] = print,
    stall_s: float = STALLS_DELAY_S,
) -> StorageRun:
    """Scenario 3: every ``fsync`` of ``pg_wal`` takes ``stall_s`` seconds more, for ``full_s``
    seconds (longer than ACK_TIMEOUT): every commit, renewals included, waits that long."""
    return _run_stalled("fsync-stalls", full_s, seed, base_dir, messages, duration, log, stall_s)


def run_fsync_stall(
    *,
    full_s: float,
    seed: int,
    base_dir: Path,
    messages: int,
    duration: float,
    log: Callable[[str], None] = print,
) -> StorageRun:
    """Scenario 4: one stall of ``full_s`` seconds: every ``fsync`` of ``pg_wal`` meanwhile waits
    until its end."""
    return _run_stalled("fsync-stall", full_s, seed, base_dir, messages, duration, log, None)


def _run_stalled(
    scenario: str,
    length: float,
    seed: int,
    base_dir: Path,
    messages: int,
    duration: float,
    log: Callable[[str], None],
    stall_s: float | None,
) -> StorageRun:
    cluster = StallCluster()
    try:
        cluster.start()
        url = cluster.create_database("zl_faults_storage")

        def hold(stop: threading.Event) -> tuple[float, float]:
            began = time.time()
            if stall_s is None:
                log(f"  {scenario}: every fsync of pg_wal waits until {length:.0f}s from now")
                cluster.stall.stall_until(began + length)
                pause(stop, length)
            else:
                log(f"  {scenario}: every fsync of pg_wal takes {stall_s:.0f}s more, for {length:.0f}s")
                cluster.stall.delay(stall_s)
                pause(stop, length)
                cluster.stall.clear()
                pause(stop, stall_s)  # the last fsync begun before the clear ends by then
            cluster.stall.clear()
            return began, time.time()

        return run_storage(
            scenario=scenario,
            database_url=url,
            fs=None,
            full_s=length + (stall_s or 0),
            seed=seed,
            run_dir=base_dir / scenario,
            messages=messages,
            duration=duration,
            log=log,
            server=cluster,
            hold=hold,
        )
    finally:
        cluster.stop()


def run_sqlite_full(
    *,
    full_s: float,
    seed: int,
    base_dir: Path,
    messages: int,
    duration: float,
    log: Callable[[str], None] = print,
) -> StorageRun:
    """Scenario 5: the filesystem of SQLite's file (and its WAL) full for ``full_s`` seconds, then freed."""
    fs = LoopFs(base_dir, "sqlitefs", 64, owner=None)
    try:
        fs.mount()
        path = fs.mountpoint / "zeroloss.sqlite3"
        url = f"sqlite:///{path}"
        migrate = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
            cwd=ROOT,
            env=child_env(url, base_dir),
            capture_output=True,
            text=True,
            timeout=180,
        )
        if migrate.returncode != 0:
            raise StorageError(f"migrate failed: {migrate.stdout}{migrate.stderr}")
        sqlite_effect_table(path)
        return run_storage(
            scenario="sqlite-full",
            database_url=url,
            fs=fs,
            full_s=full_s,
            seed=seed,
            run_dir=base_dir / "sqlite-full",
            messages=messages,
            duration=duration,
            log=log,
        )
    finally:
        fs.unmount()


def _migrated_sqlite(path: Path, run_dir: Path) -> str:
    url = f"sqlite:///{path}"
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=ROOT,
        env=child_env(url, run_dir),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if migrate.returncode != 0:
        raise StorageError(f"migrate failed: {migrate.stdout}{migrate.stderr}")
    return url


def _count_ids(path: Path, ids: list[str]) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
        sql = "SELECT count(*) FROM zeroloss_message WHERE message_id = ?"
        return {mid: int(conn.execute(sql, [mid]).fetchone()[0]) for mid in ids}


def sqlite_on_failing_disk(
    base_dir: Path, stall_s: float = 3.0, log: Callable[[str], None] = print
) -> list[str]:
    """SQLite's file on the FUSE passthrough (:mod:`.stallfs`), which first refuses what needs
    new space with ENOSPC, then stalls every fsync ``stall_s`` seconds: what ``send()``, the health report
    and ``zeroloss_status`` say each time. Returns what did not hold (empty: all did)."""
    run_dir = base_dir / "sqlite-fuse"
    run_dir.mkdir(parents=True, exist_ok=True)
    fs = StallFs(run_dir / "backing", run_dir / "mnt", run_dir / "stall.ctl", run_dir / "stallfs.log")
    prober: Prober | None = None
    problems: list[str] = []
    try:
        # migrated on the backing directory (through the passthrough, its fsyncs cost seconds)
        fs.backing.mkdir(parents=True, exist_ok=True)
        _migrated_sqlite(fs.backing / "zeroloss.sqlite3", run_dir)
        fs.mount()
        path = fs.mountpoint / "zeroloss.sqlite3"
        env = child_env(f"sqlite:///{path}", run_dir)
        prober = Prober(env, run_dir / "prober.log")

        def storage_says() -> dict[str, str]:
            probe = prober.probe()
            return {name: probe.get(name, "") for name in ("health", "status")}

        def quiet(said: dict[str, str]) -> bool:
            return all(_reports_storage(name, out) is False for name, out in said.items())

        def expect(when: str, sent: dict[str, Any], error: str, *, slow: bool = False) -> None:
            log(f"  sqlite on FUSE, {when}: send {sent}")
            if not (sent["error"].startswith(error) if error else not sent["error"]):
                problems.append(f"{when}: send() raised {sent['error']!r}, want {error or 'nothing'}")
            # a first commit on a new WAL file fsyncs it more than once (its header, its frames)
            if sent["took"] > SEND_REFUSAL_BOUND_S + (3 * stall_s if slow else 0):
                problems.append(f"{when}: send() took {sent['took']:.2f}s")
            if slow and sent["took"] < stall_s * 0.9:
                problems.append(f"{when}: send() took {sent['took']:.2f}s, less than the {stall_s}s stall")

        def expect_reports(when: str, fragment: str | None) -> None:
            """``fragment``: what both must say (None: nothing about the storage)."""
            said = storage_says()
            log(f"  sqlite on FUSE, {when}: {said}")
            for name, out in said.items():
                reports = _reports_storage(name, out)
                if fragment is None and reports is not False:
                    problems.append(f"{when}: {name} reported a storage fault: {out[-400:]}")
                if fragment is not None and not (reports and fragment in out):
                    problems.append(f"{when}: {name} did not report {fragment!r}: {out[-400:]}")

        expect("before", prober.send("fuse-1"), "")
        expect_reports("before", None)
        fs.fill()
        pause(threading.Event(), 0.2)  # the control file is re-read every 50 ms
        expect("ENOSPC", prober.send("fuse-2"), "zeroloss.exceptions.StorageFull")
        # (a new SQLite connection fails too: its -shm cannot grow, "disk I/O error")
        expect_reports("ENOSPC", "disk I/O error")
        fs.clear()
        pause(threading.Event(), 0.2)
        expect("after ENOSPC", prober.send("fuse-2"), "")  # the refused one again: stored now
        expect_reports("after ENOSPC", None)
        fs.delay(stall_s)
        pause(threading.Event(), 0.2)
        expect_reports("fsync stall", "storage stalled: a commit has taken > 2 s")
        expect("fsync stall", prober.send("fuse-3"), "", slow=True)
        fs.clear()
        # the stalled probe's fsync ends within stall_s; then a fast one answers
        wait_until(lambda: quiet(storage_says()), stall_s + 30, interval=0.5)
        expect_reports("after the stall", None)
        counts = _count_ids(path, ["fuse-1", "fuse-2", "fuse-3"])
        if counts != {"fuse-1": 1, "fuse-2": 1, "fuse-3": 1}:
            problems.append(f"each message stored once, not {counts}")
    finally:
        if prober is not None:
            prober.close()
        fs.unmount()
    return problems


def describe(run: StorageRun) -> str:
    f = run.findings
    lines = [
        f"{run.scenario}: {run.wall_s:.0f}s, full {run.fault.detail.get('full_s')}s; accepted {f.accepted}, "
        f"lost {len(f.lost)}, refused sends {f.refused_sends} ({dict(run.refused_errors)}; longest "
        f"{run.max_refusal_s}s; longest send() call {run.max_send_s}s, the last returned {run.send_past_end_s}s after a stall's end), effects twice {f.effects_twice_count}, re-runs {sum(f.reruns.values())} "
        f"{dict(f.reruns)}; resumed after {run.resume_s}s (first ack {run.resume_ack_s}s, first accepted "
        f"send {run.resume_send_s}s)",
    ]
    if run.scenario == "wal-full":
        lines.append(
            f"  server: {run.server_panics} PANIC(s) logged, found stopped {run.server_crashes} time(s), "
            f"ready again {run.server_restarts} time(s); "
            f"accepting connections again {run.up_again_s}s after the space was freed (resumption measured "
            f"from then; {run.resume_from_freed_s}s from the space being freed)"
        )
    lines.append(
        f"  handler runs started during the fault {run.runs_during}, in the {RUNS_AFTER_S:g}s after it "
        f"{run.runs_after}; claims whose lease ran out unrun (an attempt spent) {f.expired_unrun}"
    )
    for cause, n in f.rerun_causes.most_common():
        lines.append(f"  re-run because {cause}: {n}")
    for worker, fault_lines in run.fault_lines.items():
        lines.append(f"  {worker}: {len(fault_lines)} fault line(s)")
    lines += [f"  VIOLATION: {v}" for v in f.violations]
    lines += [f"  PROBLEM: {p}" for p in run.problems]
    return "\n".join(lines)


#: What counts as just after a fault: handler runs started this soon after its end.
RUNS_AFTER_S = 5.0
#: The scenarios by name (docs/guarantees.md, "Storage faults").
RUNNERS: dict[str, Callable[..., StorageRun]] = {
    "disk-full": run_disk_full,
    "wal-full": run_wal_full,
    "fsync-stalls": run_fsync_stalls,
    "fsync-stall": run_fsync_stall,
    "sqlite-full": run_sqlite_full,
}
#: The disk refuses (it is full) or stalls (every fsync waits).
STALLS = ("fsync-stalls", "fsync-stall")
#: A fault at least this long must have met a worker (the soak's; the CI profile's are shorter).
WORKER_MUST_MEET_FAULT_S = 15.0
#: Claims a soak's stall may leave to run out unrun (a sweep can win the moment between two
#: revivals of one claim; before the revival, a soak's minute of slowed fsyncs left 6 and 7).
EXPIRED_UNRUN_MOST = 2
#: What the CI profile runs, each shortened (about 40 s each); the soak runs them too, longer.
CI_STORAGE = ("disk-full", "wal-full", "fsync-stalls", "fsync-stall", "sqlite-full")


def run_scenarios(
    names: list[str], profile: Any, seed: int, base_dir: Path, log: Callable[[str], None] = print
) -> list[StorageRun]:
    """Each named scenario with the profile's fault length and workload (sending goes on for
    ``storage_duration`` seconds, or ``storage_tail_s`` past a fault that ends later)."""
    runs = []
    for name in names:
        length = {"fsync-stalls": profile.storage_stalls_s, "fsync-stall": profile.storage_stall_s}.get(
            name, profile.storage_full_s
        )
        # the fault starts a third of the way in (at most FAULT_AT_MOST_S); repeated stalls
        # end one delayed fsync after their length
        lasts = length + (STALLS_DELAY_S if name == "fsync-stalls" else 0.0)
        starts = min(profile.storage_duration / 3, FAULT_AT_MOST_S)
        duration = max(profile.storage_duration, starts + lasts + profile.storage_tail_s)
        runs.append(
            RUNNERS[name](
                full_s=length,
                seed=seed,
                base_dir=base_dir,
                messages=int(profile.storage_messages * duration / profile.storage_duration),
                duration=duration,
                log=log,
            )
        )
    return runs


def report(runs: list[StorageRun]) -> str:
    """The table of docs/guarantees.md ("Storage faults, tested"), then each run's details."""
    lines = [
        "| scenario | fault lasted | accepted | lost | refused sends (longest s) | effects twice | re-runs (tx, plain) "
        "| s to resume (ack, send) | worker fault lines | probes reporting it (health / status) | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        f = run.findings
        during = "/".join(
            f"{sum(_reports_storage(name, pr.get(name, ''), run.scenario) is True for pr in run.during)} of "
            f"{len(run.during)}"
            for name in ("health", "status")
        )
        counts = sorted({len(v) for v in run.fault_lines.values()})
        lines.append(
            f"| {run.scenario} | {run.fault.detail.get('full_s')} s | {f.accepted} | {len(f.lost)} | "
            f"{f.refused_sends} ({run.max_refusal_s}) | {f.effects_twice_count} | {sum(f.reruns.values())} "
            f"({f.reruns.get('tx', 0)}, {f.reruns.get('plain', 0)}) | {run.resume_s} ({run.resume_ack_s}, "
            f"{run.resume_send_s}) | {'/'.join(map(str, counts))} per worker | {during} | {run.wall_s:.0f} |"
        )
    lines.append("")
    lines += [describe(run) for run in runs]
    return "\n".join(lines)
