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

from .checker import Checker, read_sends
from .cluster import FaultCluster
from .injector import Fault
from .workload import ROOT, Proc, WorkerPool, child_env, producer, sweeper
from .zeroloss_handlers import EFFECT_TABLE

#: The documented exceptions of a refused ``send()`` (docs/guarantees.md, "The disk fills").
DOCUMENTED_SEND_ERRORS = {"django.db.utils.OperationalError", "django.db.utils.InterfaceError"}
#: The longest a refused ``send()`` may take during a storage fault (docs/guarantees.md).
SEND_REFUSAL_BOUND_S = 5.0
#: Processing resumes within this many seconds of the space being freed (the issue's target).
RESUME_TARGET_S = 5.0
FILLER = ".zl-filler"


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

    def hold_full(self, seconds: float, stop: threading.Event) -> tuple[float, float]:
        """Full for ``seconds`` (less if ``stop`` is set), topping up every 0.2 s, then freed.

        Returns (full since, freed at) as wall-clock times."""
        self.fill()
        began = time.time()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not pause(stop, min(0.2, deadline - time.monotonic())):
            self.fill()  # what the server freed (a temporary file, a recycled segment) is taken again
        self.free()
        return began, time.time()

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
    """The fault suite's PostgreSQL with its data directory on a loop filesystem of ``size_mb``."""

    def __init__(self, size_mb: int = 160) -> None:
        super().__init__()
        self.data_fs = LoopFs(self.root, "datafs", size_mb)
        # initdb wants an empty directory: the mount point has lost+found
        self.primary_dir = self.data_fs.mountpoint / "pgdata"
        self.wal_dir = self.root / "pg_wal"

    def start(self) -> None:
        try:
            self.data_fs.mount()
            self.initdb_extra = ("--waldir", str(self.wal_dir))
            super().start()
            with self.connect(dbname="postgres") as conn:
                # what the fault suite's cluster leaves to its defaults, kept small for the small disk
                conn.execute("ALTER SYSTEM SET max_wal_size = '256MB'")
                conn.execute("SELECT pg_reload_conf()")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.data_fs.unmount()


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
    resume_ack_s: float | None = None
    resume_send_s: float | None = None
    during: dict[str, Any] = field(default_factory=dict)
    after: dict[str, Any] = field(default_factory=dict)
    fault_lines: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def resume_s(self) -> float | None:
        if self.resume_ack_s is None or self.resume_send_s is None:
            return None
        return max(self.resume_ack_s, self.resume_send_s)

    @property
    def ok(self) -> bool:
        return not self.findings.violations and not self.problems


class Prober:
    """A process that has Django loaded and waits: each :meth:`probe` makes it read what the
    health report (uncached) and ``zeroloss_status --json --no-cache`` say now, so that no
    process start (seconds on a loaded host) eats into the fault."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self._err = open(log, "ab")  # noqa: SIM115 - closed by close()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.faults.storage", "probe"],
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

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._err.close()


def _serve_probes() -> None:
    """The prober's side: one JSON line per line read (``python -m tests.faults.storage probe``)."""
    import io

    from django.core.management import call_command

    from zeroloss.health import health_report

    print("ready", flush=True)
    for _ in sys.stdin:
        began = time.time()
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


def run_storage(
    *,
    scenario: str,
    database_url: str,
    fs: LoopFs,
    full_s: float,
    seed: int,
    run_dir: Path,
    messages: int,
    duration: float,
    ack_timeout: float = 2.0,
    log: Callable[[str], None] = print,
) -> StorageRun:
    """The workload with ``fs`` held full for ``full_s`` seconds from about a third of ``duration``."""
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
        pause(stop, duration / 3)
        log(f"  {scenario}: filling {fs.mountpoint} ({fs.free_bytes() >> 20} MiB free) for {full_s:.0f}s")
        holder_result: list[tuple[float, float]] = []
        holder = threading.Thread(
            target=lambda: holder_result.append(fs.hold_full(full_s, stop)), daemon=True
        )
        holder.start()
        pause(stop, 1.0)
        during = prober.probe()
        log(f"  {scenario}: health and status probed in {during['done_at'] - during['began']:.1f}s")
        holder.join(timeout=full_s + 60)
        if not holder_result:
            raise RuntimeError(f"{scenario}: the filesystem was not freed within {full_s + 60:.0f}s")
        began, freed = holder_result[0]
        log(f"  {scenario}: full {began:.1f} .. freed {freed:.1f} ({freed - began:.1f}s)")
        if during["done_at"] > freed:
            raise RuntimeError(f"{scenario}: the health and status probes outlasted the fault")
        resume_ack, resume_send = _first_after(database_url, freed, 60)
        wait_until(lambda: not producer_proc.alive, duration + 180, interval=0.5)
        if producer_proc.alive:
            producer_proc.terminate(timeout=30)
        done = _drained(database_url, 120)
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


def _reports_storage(name: str, output: str) -> bool | None:
    """Whether the health report's or zeroloss_status's JSON reports a storage fault (None: no JSON)."""
    try:
        data = json.loads(output)
    except ValueError:
        return None
    if name == "health":
        return data["checks"]["storage"]["ok"] is False and data["status"] == "fail"
    return bool(data.get("storage"))


def _judge(run: StorageRun, sweep_exit: int, drained: bool) -> None:
    """The storage-specific checks, besides the checker's."""
    p = run.problems
    sends = read_sends(run.run_dir / "sends.log")
    refused = [s for s in sends if not s.accepted]
    run.refused_errors = Counter(s.error for s in refused)
    run.max_refusal_s = round(max((s.returned - s.began for s in refused), default=0.0), 2)
    undocumented = set(run.refused_errors) - DOCUMENTED_SEND_ERRORS
    if undocumented:
        p.append(f"send() refused with undocumented exceptions: {sorted(undocumented)}")
    if run.max_refusal_s > SEND_REFUSAL_BOUND_S:
        p.append(f"a refused send() took {run.max_refusal_s}s (bound {SEND_REFUSAL_BOUND_S}s)")
    if not drained:
        p.append("the ledger did not drain within 120 s of the producer's end")
    if sweep_exit not in (0, -15):
        p.append(f"zeroloss_sweep --loop exited {sweep_exit}")
    if run.resume_s is None or run.resume_s > RESUME_TARGET_S:
        p.append(
            f"processing resumed {run.resume_s}s after the space was freed (first acknowledgement "
            f"{run.resume_ack_s}s, first accepted send {run.resume_send_s}s; target {RESUME_TARGET_S}s)"
        )
    for when, want in (("during", True), ("after", False)):
        seen = getattr(run, when)
        for name in ("health", "status"):
            reported = _reports_storage(name, seen.get(name, ""))
            if reported is not want:
                p.append(
                    f"{name} {'did not report' if want else 'still reported'} the storage fault {when} it: "
                    f"{seen.get(name, '')[-600:]}"
                )
    for worker, lines in run.fault_lines.items():
        starts = [line for line in lines if "since" in line]
        ends = [line for line in lines if "again" in line]
        # a worker that met no refusal (it had nothing to write meanwhile) logs nothing
        if len(starts) > 1 or len(ends) != len(starts):
            p.append(
                f"{worker} logged the fault {len(starts)} time(s) at its start and {len(ends)} at its end "
                f"(want once each): {lines[:6]}"
            )
    if not any(run.fault_lines.values()):
        p.append("no worker met the fault: nothing was refused them (lengthen it)")


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
    cluster = StorageCluster()
    try:
        cluster.start()
        url = cluster.create_database("zl_faults_storage")
        return run_storage(
            scenario="disk-full",
            database_url=url,
            fs=cluster.data_fs,
            full_s=full_s,
            seed=seed,
            run_dir=base_dir / "disk-full",
            messages=messages,
            duration=duration,
            log=log,
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


def describe(run: StorageRun) -> str:
    f = run.findings
    lines = [
        f"{run.scenario}: {run.wall_s:.0f}s, full {run.fault.detail.get('full_s')}s; accepted {f.accepted}, "
        f"lost {len(f.lost)}, refused sends {f.refused_sends} ({dict(run.refused_errors)}; longest "
        f"{run.max_refusal_s}s), effects twice {f.effects_twice_count}, re-runs {sum(f.reruns.values())} "
        f"{dict(f.reruns)}; resumed after {run.resume_s}s (first ack {run.resume_ack_s}s, first accepted "
        f"send {run.resume_send_s}s)",
    ]
    for cause, n in f.rerun_causes.most_common():
        lines.append(f"  re-run because {cause}: {n}")
    for worker, fault_lines in run.fault_lines.items():
        lines.append(f"  {worker}: {len(fault_lines)} fault line(s)")
    lines += [f"  VIOLATION: {v}" for v in f.violations]
    lines += [f"  PROBLEM: {p}" for p in run.problems]
    return "\n".join(lines)


#: The scenarios by name (docs/guarantees.md, "Storage faults").
RUNNERS: dict[str, Callable[..., StorageRun]] = {"disk-full": run_disk_full, "sqlite-full": run_sqlite_full}


def run_scenarios(
    names: list[str], profile: Any, seed: int, base_dir: Path, log: Callable[[str], None] = print
) -> list[StorageRun]:
    """Each named scenario with the profile's fill time and workload."""
    return [
        RUNNERS[name](
            full_s=profile.storage_full_s,
            seed=seed,
            base_dir=base_dir,
            messages=profile.storage_messages,
            duration=profile.storage_duration,
            log=log,
        )
        for name in names
    ]


def report(runs: list[StorageRun]) -> str:
    """The table of docs/guarantees.md ("Storage faults, tested"), then each run's details."""
    lines = [
        "| scenario | fault | accepted | lost | refused sends (longest s) | effects twice | re-runs (tx, plain) "
        "| s to resume (ack, send) | worker fault lines | health / status during | wall s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        f = run.findings
        during = "/".join(
            "yes" if _reports_storage(name, run.during.get(name, "")) else "NO"
            for name in ("health", "status")
        )
        counts = sorted({len(v) for v in run.fault_lines.values()})
        lines.append(
            f"| {run.scenario} | full {run.fault.detail.get('full_s')} s | {f.accepted} | {len(f.lost)} | "
            f"{f.refused_sends} ({run.max_refusal_s}) | {f.effects_twice_count} | {sum(f.reruns.values())} "
            f"({f.reruns.get('tx', 0)}, {f.reruns.get('plain', 0)}) | {run.resume_s} ({run.resume_ack_s}, "
            f"{run.resume_send_s}) | {'/'.join(map(str, counts))} per worker | {during} | {run.wall_s:.0f} |"
        )
    lines.append("")
    lines += [describe(run) for run in runs]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m tests.faults.storage disk-full|sqlite-full|probe [ci|soak] [dir]
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    if sys.argv[1] == "probe":
        _serve_probes()
        sys.exit(0)
    from .scenario import PROFILES

    base = Path(sys.argv[3] if len(sys.argv) > 3 else "/tmp/zl-i51-run")
    base.mkdir(parents=True, exist_ok=True)
    results = run_scenarios(
        sys.argv[1].split(","), PROFILES[sys.argv[2] if len(sys.argv) > 2 else "ci"], 1, base
    )
    print(report(results))
