"""The workload's processes: workers (``zeroloss_worker`` or Celery), the producer, a sweeper.

Each runs in its own session (so a signal to its process group reaches all of it, Celery's
prefork children included), with its output in a log file of the run's directory.
:class:`WorkerPool` keeps one process per slot and the history of every generation (pid,
start, end, how it ended); its supervisor thread restarts a worker that died without the
injector killing it, and records that as a finding.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.waiting import wait_until

from .zeroloss_handlers import DIR_ENV, PLAIN_QUEUE, TX_QUEUE

ROOT = Path(__file__).resolve().parents[2]
QUEUES = [TX_QUEUE, PLAIN_QUEUE]
#: Variables of the caller's environment that would change what the children do.
STRIPPED_ENV = (
    "DATABASE_URL",
    "DJANGO_SETTINGS_MODULE",
    "CELERY_BROKER_URL",
    "REDIS_URL",
    "ZEROLOSS_ACK_TIMEOUT",
    "ZEROLOSS_SWEEP_INTERVAL",
    "ZEROLOSS_REDISPATCH_AFTER",
    "ZEROLOSS_RETRY_BACKOFF_BASE",
    "ZEROLOSS_EXTRA_APPS",
    "ZEROLOSS_LOG_LEVEL",
    "PGAPPNAME",
)


def child_env(database_url: str, run_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in STRIPPED_ENV}
    env.update(
        DATABASE_URL=database_url,
        DJANGO_SETTINGS_MODULE="project.settings",
        DJANGO_DEBUG="0",  # DEBUG would keep every statement in memory, unlike production
        PYTHONPATH=str(ROOT),
        ZEROLOSS_EXTRA_APPS="tests.faults",
        ZEROLOSS_LOG_LEVEL="WARNING",
        ZEROLOSS_VAR_DIR=str(run_dir / "var"),
    )
    env[DIR_ENV] = str(run_dir)
    env.update(extra)
    return env


#: Every process started and not yet reaped: killed at interpreter exit whatever happened.
_LIVE: set[Proc] = set()


@atexit.register
def _kill_leftovers() -> None:
    for proc in list(_LIVE):
        proc.signal(signal.SIGCONT)
        proc.signal(signal.SIGKILL)


class Proc:
    """One process in its own session, output to ``log``."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.args = args
        self.log_path = log
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(
                args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.pid = self.popen.pid
        self.started = time.time()
        _LIVE.add(self)

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        """Signal the process group, only while it is ours (its leader or a member lives: a
        group id is not reused while any member lives)."""
        if self.alive or _live_group_members(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def kill(self) -> list[int]:
        """SIGKILL the whole group and wait until none of it is left; returns the pids killed."""
        members = _live_group_members(self.pid)
        self.signal(signal.SIGKILL)
        self.popen.wait(timeout=10)
        if not wait_until(lambda: not _live_group_members(self.pid), 10, interval=0.02):
            raise RuntimeError(f"{self.name}: processes of group {self.pid} outlived SIGKILL by 10s")
        return sorted({self.pid, *members})

    def terminate(self, timeout: float = 30, *, signalled: bool = False) -> int:
        """SIGTERM once (after SIGCONT, in case it is frozen), unless ``signalled`` already — a
        second SIGTERM would force a worker's exit — and SIGKILL if it outlives ``timeout``."""
        if self.alive:
            if not signalled:
                self.signal(signal.SIGCONT)
                self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        else:
            self.signal(signal.SIGKILL)  # children a dead leader left behind, if any
        return self.popen.returncode

    def wait_for_text(self, needle: str, timeout: float) -> None:

        def seen() -> bool:
            if needle in self.log(tail=1_000_000):
                return True
            if not self.alive:
                raise RuntimeError(
                    f"{self.name} exited ({self.popen.returncode}) before {needle!r}:\n{self.log()}"
                )
            return False

        if not wait_until(seen, timeout):
            raise RuntimeError(f"{self.name}: {needle!r} not seen in {timeout}s:\n{self.log()}")


def _live_group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        state, _ppid, pgrp = text[text.rfind(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members


@dataclass
class Generation:
    """One process that served a slot."""

    slot: int
    number: int
    pid: int
    started: float
    health: Path | None
    log: Path
    ready_at: float | None = None
    ended: float | None = None
    #: ``sigkill`` (the injector), ``sigterm`` (the end of the run), ``died`` (on its own: a finding).
    how: str = ""
    exit_code: int | None = None
    #: Its last outcome counters (``--health-file``; zeroloss_worker only).
    outcomes: dict[str, int] = field(default_factory=dict)
    #: Every pid of its process group when it was killed (Celery's prefork children too).
    pids: list[int] = field(default_factory=list)


class WorkerPool:
    """``count`` workers of one kind; ``kill``/``restart``/``pause``/``resume`` by slot."""

    def __init__(
        self,
        kind: str,
        count: int,
        env: dict[str, str],
        run_dir: Path,
        *,
        concurrency: int = 2,
        queues: list[str] | None = None,
        prefix: list[str] | None = None,
        name: str = "w",
    ) -> None:
        """``queues``: what a zeroloss_worker drains (both workload queues by default);
        ``prefix``: prepended to each worker's command (``ip netns exec NAME``: a worker on
        another "host"); ``name``: the slots' name prefix in logs and ``application_name``."""
        if kind not in ("zeroloss", "celery"):
            raise ValueError(kind)
        self.kind = kind
        self.queues = list(queues or QUEUES)
        self.prefix = list(prefix or [])
        self.name = name
        self.count = count
        self.env = env
        self.run_dir = run_dir
        self.concurrency = concurrency
        self.procs: dict[int, Proc] = {}
        self.generations: list[Generation] = []
        self._current: dict[int, Generation] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        (run_dir / "workers").mkdir(parents=True, exist_ok=True)

    # -- processes --------------------------------------------------------------------------

    def _spawn(self, slot: int) -> Proc:
        number = sum(1 for g in self.generations if g.slot == slot) + 1
        name = f"{self.name}{slot}g{number}"
        log = self.run_dir / "workers" / f"{name}.log"
        health: Path | None = None
        env = dict(self.env, PGAPPNAME=f"faults-{name}")
        if self.kind == "zeroloss":
            health = self.run_dir / "workers" / f"{name}.health.json"
            args = [sys.executable, "manage.py", "zeroloss_worker", "--concurrency", str(self.concurrency)]
            for queue in self.queues:
                args += ["--queue", queue]
            args += ["--health-file", str(health)]
        else:
            args = [sys.executable, "-m", "celery", "-A", "project", "worker", "--queues", "celery"]
            args += ["--pool", "prefork", "--concurrency", str(self.concurrency), "--loglevel", "INFO"]
            args += [
                "--hostname",
                f"{name}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
            args += ["--prefetch-multiplier", "1"]
        proc = Proc(name, [*self.prefix, *args], env, log)
        generation = Generation(slot, number, proc.pid, proc.started, health, log)
        self.generations.append(generation)
        self._current[slot] = generation
        self.procs[slot] = proc
        return proc

    def start(self, timeout: float = 90) -> None:
        with self._lock:
            for slot in range(self.count):
                self._spawn(slot)
        for slot in range(self.count):
            self.wait_ready(slot, timeout)
        self._supervisor.start()

    def ready(self, slot: int) -> bool:
        proc = self.procs[slot]
        if not proc.alive:
            return False
        generation = self._current[slot]
        if generation.ready_at is None:
            ready = generation.health.exists() if generation.health else "ready." in proc.log(tail=1_000_000)
            if ready:
                generation.ready_at = time.time()
        return generation.ready_at is not None

    def wait_ready(self, slot: int, timeout: float) -> None:

        def ready() -> bool:
            if self.ready(slot):
                return True
            proc = self.procs[slot]
            if not proc.alive:
                raise RuntimeError(f"worker {proc.name} exited ({proc.popen.returncode}):\n{proc.log()}")
            return False

        if not wait_until(ready, timeout):
            proc = self.procs[slot]
            raise RuntimeError(f"worker {proc.name} not ready in {timeout}s:\n{proc.log()}")

    def pid(self, slot: int) -> int:
        return self.procs[slot].pid

    def appname(self, slot: int) -> str:
        """The PostgreSQL application_name of the slot's current worker (PGAPPNAME)."""
        return f"faults-{self.procs[slot].name}"

    def _ended(self, slot: int, how: str) -> Generation:
        generation = self._current[slot]
        proc = self.procs[slot]
        generation.ended = time.time()
        generation.how = how
        generation.exit_code = proc.popen.returncode
        generation.outcomes = self.outcomes(slot)
        return generation

    def kill(self, slot: int, killer: Callable[[], list[int]] | None = None) -> Generation:
        """SIGKILL the slot's worker (not restarted: call :meth:`restart`). ``killer``, if given,
        does the killing instead (every process of a namespace: a host that dies) and returns
        the pids it killed."""
        with self._lock:
            pids = sorted({*killer(), *self.procs[slot].kill()}) if killer else self.procs[slot].kill()
            generation = self._ended(slot, "sigkill")
            generation.pids = pids
            return generation

    def restart(self, slot: int) -> Proc:
        with self._lock:
            return self._spawn(slot)

    def pause(self, slot: int) -> None:
        self.procs[slot].signal(signal.SIGSTOP)

    def resume(self, slot: int) -> None:
        self.procs[slot].signal(signal.SIGCONT)

    def outcomes(self, slot: int) -> dict[str, int]:
        """The worker's outcome counters from its health file (zeroloss_worker; about 1 s old)."""
        health = self._current[slot].health
        if health is None:
            return {}
        try:
            return dict(json.loads(health.read_text()).get("outcomes", {}))
        except (OSError, ValueError):
            return {}

    def health_updated(self, slot: int) -> float:
        health = self._current[slot].health
        try:
            return float(json.loads(health.read_text())["updated_at"]) if health else 0.0
        except (OSError, ValueError, KeyError):
            return 0.0

    def _supervise(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                for slot, proc in list(self.procs.items()):
                    if not proc.alive and self._current[slot].ended is None:
                        self._ended(slot, "died")
                        proc.signal(signal.SIGKILL)  # children its leader left behind, if any
                        self._spawn(slot)

    def shutdown(self, timeout: float = 45) -> None:
        """Stop the supervisor, then every worker with SIGTERM (a clean stop)."""
        self._stop.set()
        if self._supervisor.is_alive():
            self._supervisor.join(timeout=5)
        with self._lock:
            for slot, proc in self.procs.items():
                if self._current[slot].ended is None:
                    proc.signal(signal.SIGCONT)
                    proc.signal(signal.SIGTERM)
            for slot, proc in self.procs.items():
                if self._current[slot].ended is None:
                    proc.terminate(timeout, signalled=True)
                    # -SIGTERM: it was still starting up, before its own handler was installed.
                    self._ended(slot, "sigterm" if proc.popen.returncode in (0, -signal.SIGTERM) else "died")

    def kill_all(self) -> None:
        """Last-resort clean-up (errors, atexit): nothing of the pool survives."""
        self._stop.set()
        for proc in list(self.procs.values()):
            proc.signal(signal.SIGCONT)
            with contextlib.suppress(Exception):
                proc.kill()


def producer(env: dict[str, str], run_dir: Path, args: dict[str, Any]) -> Proc:
    return Proc(
        "producer",
        [sys.executable, "-m", "tests.faults.producer", json.dumps(args)],
        env,
        run_dir / "producer.log",
    )


def sweeper(env: dict[str, str], run_dir: Path, interval: float = 1.0) -> Proc:
    return Proc(
        "sweeper",
        [sys.executable, "manage.py", "zeroloss_sweep", "--loop", "--interval", str(interval)],
        env,
        run_dir / "sweeper.log",
    )
