"""The worker's supervisor: which threads a worker process runs, and what happens when one dies.

:data:`PARTS` is the one table of them. Each part either has a thread of its own, started and
watched here, or runs in rounds on the supervisor's own loop (the main thread). Its policy
says what a failure does:

- ``RESTART``: logged, and the part runs again after a backoff; the worker keeps processing
  meanwhile and its health file says ``degraded`` until the part is back.
- ``EXIT``: the worker stops cleanly (messages in hand finish or go back) and exits 1 with a
  line naming the part, so the process manager starts a fresh process.

Whatever the policy, a database unreachable past ``DB_OUTAGE_TOLERANCE`` ends the worker with
exit code 4. docs/worker.md explains each choice.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ...core.outage import Backoff, OutageTooLong
from ..sweep_loop import StopFlag

logger = logging.getLogger("zeroloss")

__all__ = [
    "CLAIMER",
    "HEALTH_FILE",
    "KEEPER",
    "LISTENER",
    "METRICS",
    "PARTS",
    "SCHEDULER",
    "SWEEP",
    "Part",
    "Policy",
    "Supervised",
    "Supervisor",
]


class Policy(StrEnum):
    RESTART = "restart"
    EXIT = "exit"


@dataclass(frozen=True)
class Part:
    """One part of a worker process, as the table declares it."""

    name: str
    policy: Policy
    #: True: a thread of its own (named ``zeroloss-<name>``); False: rounds on the supervisor's loop.
    own_thread: bool
    #: Its actor name in the audit trail, after the worker's instance id (``<instance>/<actor>``).
    actor: str = ""
    what: str = ""


CLAIMER = Part(
    "claimer",
    Policy.EXIT,
    own_thread=True,
    actor="t{n}",
    what="claims batches, runs their handlers, records the outcomes (one per --concurrency)",
)
KEEPER = Part(
    "keeper",
    Policy.EXIT,
    own_thread=True,
    actor="keeper",
    what="renews the leases in hand, polls aborts, gives back unstarted messages",
)
LISTENER = Part(
    "listener",
    Policy.RESTART,
    own_thread=True,
    what="LISTENs for wake-ups (PostgreSQL); idle claimers poll meanwhile",
)
METRICS = Part(
    "metrics",
    Policy.EXIT,
    own_thread=True,
    what="serves --metrics-port (started by prometheus_client, watched here)",
)
SWEEP = Part(
    "sweep",
    Policy.RESTART,
    own_thread=False,
    actor="sweep",
    what="requeues expired leases every SWEEP_INTERVAL, then the after-sweep hooks",
)
SCHEDULER = Part(
    "scheduler",
    Policy.RESTART,
    own_thread=False,
    actor="schedule",
    what="sends the schedules' messages every SCHEDULE_INTERVAL",
)
HEALTH_FILE = Part(
    "health-file",
    Policy.RESTART,
    own_thread=False,
    what="rewrites --health-file about every second",
)
PARTS: tuple[Part, ...] = (CLAIMER, KEEPER, LISTENER, METRICS, SWEEP, SCHEDULER, HEALTH_FILE)


@dataclass
class Supervised:
    """One running instance of a part: its thread (or rounds), failures and restarts."""

    part: Part
    name: str
    #: The thread's body; None for a thread started elsewhere (it cannot be restarted).
    body: Callable[[], None] | None
    thread: threading.Thread | None = None
    restarts: int = 0
    failures: int = 0
    last_error: str = ""
    #: Monotonic time of the next restart (a round: of the next try) while it is down.
    down_until: float | None = None
    backoff: Backoff = field(default_factory=Backoff)

    @property
    def alive(self) -> bool:
        if not self.part.own_thread:
            return self.down_until is None
        return self.thread is not None and self.thread.is_alive()

    def status(self) -> dict[str, Any]:
        return {
            "policy": str(self.part.policy),
            "alive": self.alive,
            "restarts": self.restarts,
            "failures": self.failures,
            "last_error": self.last_error,
        }


class Supervisor:
    """Starts the parts' threads and applies their policies (see the module docstring).

    :meth:`check` runs on the supervisor's loop: a dead ``RESTART`` thread is started again
    after its backoff; a dead ``EXIT`` thread sets the stop flag with reason ``"crash"`` (or
    ``"db-outage"``), and :attr:`exit_cause` names it.
    """

    def __init__(self, stop: StopFlag) -> None:
        self.stop = stop
        self.parts: list[Supervised] = []
        #: The part whose death ended the worker, and why; None while none did.
        self.exit_cause: tuple[Supervised, BaseException] | None = None
        #: Set by :meth:`shutting_down`: the worker ends (burst done too, not only on a stop flag).
        self.ending = False
        self._lock = threading.Lock()

    def add(self, part: Part, body: Callable[[], None], *, name: str | None = None) -> Supervised:
        """Declare a running instance of ``part``: a thread running ``body``, or a round."""
        unit = Supervised(part, name or part.name, body)
        self.parts.append(unit)
        return unit

    def watch(self, part: Part, thread: threading.Thread) -> Supervised:
        """Watch a thread started elsewhere; it cannot be restarted, so its part must ``EXIT``."""
        if part.policy is not Policy.EXIT:
            raise ValueError(
                f"{part.name}: a thread started elsewhere cannot be restarted; its policy must be EXIT"
            )
        unit = Supervised(part, part.name, None, thread)
        self.parts.append(unit)
        return unit

    def start(self) -> None:
        for unit in self.parts:
            if unit.part.own_thread and unit.thread is None:
                self._start(unit)

    def _start(self, unit: Supervised) -> None:
        unit.down_until = None
        unit.thread = threading.Thread(
            target=self._run, args=(unit,), name=f"zeroloss-{unit.name}", daemon=True
        )
        unit.thread.start()

    def _run(self, unit: Supervised) -> None:
        assert unit.body is not None
        try:
            unit.body()
        except BaseException as exc:
            self.failed(unit, exc)
            return
        if unit.part.policy is Policy.RESTART and not (self.stop or self.ending):
            # Only a stop ends a restartable part: returning early is a failure like any other.
            self.failed(unit, RuntimeError("its thread returned while the worker runs"))

    def failed(self, unit: Supervised, exc: BaseException) -> None:
        """``unit`` died of ``exc`` (a thread's end, a round's exception): apply its policy."""
        with self._lock:
            unit.failures += 1
            unit.last_error = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, OutageTooLong) or unit.part.policy is Policy.EXIT:
                self._exit(unit, exc)
                return
            delay = unit.backoff.next()
            unit.down_until = time.monotonic() + delay
        logger.error(
            "worker %s failed (%s); restarting it in %.1fs (policy: restart)",
            unit.name,
            unit.last_error,
            delay,
            exc_info=(type(exc), exc, exc.__traceback__),
        )

    def _exit(self, unit: Supervised, exc: BaseException) -> None:
        outage = isinstance(exc, OutageTooLong)
        if self.exit_cause is None:
            self.exit_cause = (unit, exc)
        if outage:
            logger.error("worker %s: %s; the worker stops (exit code 4)", unit.name, exc)
        else:
            logger.error(
                "worker %s died (%s); the worker stops (policy: exit, exit code 1)",
                unit.name,
                unit.last_error,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
        self.stop.set("db-outage" if outage else "crash")

    def succeeded(self, unit: Supervised) -> None:
        """A round of ``unit`` went through: it is up again."""
        with self._lock:
            if unit.down_until is not None:
                unit.restarts += 1
            unit.down_until = None
            unit.backoff.reset()

    def due(self, unit: Supervised) -> bool:
        """A round may run now: not waiting out a failure's backoff."""
        return unit.down_until is None or time.monotonic() >= unit.down_until

    def shutting_down(self) -> None:
        """The worker ends: parts that return from now on are done, not failed."""
        self.ending = True

    def check(self) -> None:
        """Restart the ``RESTART`` threads that died once their backoff has passed."""
        if self.stop or self.ending:
            return
        now = time.monotonic()
        for unit in self.parts:
            if not unit.part.own_thread or unit.alive:
                continue
            if unit.body is None and self.exit_cause is None:
                # A watched thread ended: it cannot say why, so it counts as a crash.
                self.failed(unit, RuntimeError(f"thread {unit.thread.name if unit.thread else '?'} ended"))
            elif (
                unit.part.policy is Policy.RESTART and unit.down_until is not None and now >= unit.down_until
            ):
                unit.restarts += 1
                logger.warning("worker %s restarted (restart %d)", unit.name, unit.restarts)
                self._start(unit)

    @property
    def degraded(self) -> bool:
        """A part is down, waiting for its restart."""
        return any(u.down_until is not None for u in self.parts)

    def status(self) -> dict[str, dict[str, Any]]:
        """Each part's state, for the health file."""
        return {unit.name: unit.status() for unit in self.parts}

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for unit in self.parts:
            if unit.thread is not None and unit.body is not None:
                unit.thread.join(max(deadline - time.monotonic(), 0))
