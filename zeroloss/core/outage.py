"""Riding out a database outage: tell a lost connection from a bug, back off, log once, reconnect.

Every long-running loop (worker claims, lease keeper, outcome flushes, sweeps, the LISTEN
wake-up, the Celery delivery task) wraps its unit of work in :meth:`OutageMonitor.attempt`.
A connection-level error — refused, terminated by the server, server closed the connection,
admin shutdown, a failover, SQLite's "database is locked" — closes the broken connection and
is retried after a capped, jittered backoff (0.1 s doubling to 5 s). One line is logged when
the outage starts and one when it ends, never a traceback per retry. Anything else (a bug,
bad data) is not an outage and propagates as before.

A *storage fault* (the database's disk is full or failing: PostgreSQL's SQLSTATE 53100, "could
not extend file ... No space left on device", or 58030; SQLite's "database or disk is full") is ridden out the
same way, logged as ``storage fault`` rather than ``unreachable``. Statements that need no new
space still succeed meanwhile, so a storage fault ends only once ``STORAGE_FAULT_QUIET``
seconds have passed without one (else every success between two refusals would log an end and
the next refusal a new start). ``zeroloss.ops.health.storage_fault`` asks the database whether its
disk takes new data now, for the health report and ``zeroloss_status``.

``ZEROLOSS["DB_OUTAGE_TOLERANCE"]`` (seconds, default unlimited) makes a process give up after
that long, for supervisors that prefer a restart.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from django.db import InterfaceError, OperationalError, connections

from ..exceptions import StorageFull

logger = logging.getLogger("zeroloss")

T = TypeVar("T")
P = ParamSpec("P")

BACKOFF_FIRST = 0.1
BACKOFF_MAX = 5.0


def _psycopg_errors() -> tuple[type[BaseException], ...]:
    """The drivers' own connection errors (raised where Django's wrapping is not in the way),
    for whichever of psycopg 3 and psycopg2 is installed."""
    found: list[type[BaseException]] = []
    for name in ("psycopg", "psycopg2"):
        try:
            driver = __import__(name)
        except ImportError:  # SQLite-only installs, or the other driver
            continue
        found += [driver.OperationalError, driver.InterfaceError]
    return tuple(found)


#: Errors that mean "the database could not be reached or dropped us", not "your code is wrong".
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (OperationalError, InterfaceError, *_psycopg_errors())


#: SQLSTATEs that mean "this server is not (or no longer) the writable primary": a node fenced
#: read-only in a failover, an admin or crash shutdown, a server still starting.
_OUTAGE_SQLSTATES = {"25006", "57P01", "57P02", "57P03"}


#: SQLSTATEs of a disk that refuses writes: 53100 disk_full, 58030 io_error.
_STORAGE_SQLSTATES = {"53100", "58030"}
#: Messages of a full or failing disk where no SQLSTATE says so: SQLite's, the system's, and
#: PostgreSQL's refusal of a new session whose start needs to write a file (a connection error).
_STORAGE_MESSAGES = (
    "database or disk is full",
    "disk i/o error",
    "no space left on device",
    "could not write init file",
)
#: Seconds without a storage error before a storage fault is declared over (see the module doc):
#: two backoff caps, so that every loop that was refused has tried again meanwhile.
STORAGE_FAULT_QUIET = 2 * BACKOFF_MAX


def is_storage_fault(exc: BaseException) -> bool:
    """Whether ``exc`` says the database's storage refused a write (a full or failing disk)."""
    if isinstance(exc, StorageFull):
        return True
    cause = exc.__cause__ or exc
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    if isinstance(sqlstate, str):
        return sqlstate in _STORAGE_SQLSTATES
    text = str(exc).lower()
    return any(message in text for message in _STORAGE_MESSAGES)


def refused_for_storage(exc: BaseException, message_id: str | None, alias: str) -> None:
    """Raise :class:`StorageFull` (from the driver's error) if ``exc`` is a storage fault: a
    send refused for lack of space is told apart from an outage, never a raw driver error."""
    if isinstance(exc, OperationalError) and not isinstance(exc, StorageFull) and is_storage_fault(exc):
        raise StorageFull(message_id, alias, exc.__cause__ or exc) from (exc.__cause__ or exc)


def refusing_for_storage(store: Callable[Concatenate[Any, P], T]) -> Callable[Concatenate[Any, P], T]:
    """A method of the ledger's store (on ``self.using``; its first argument, a message id or
    not) that raises :class:`StorageFull` where the database refused it for lack of space."""

    @functools.wraps(store)
    def refusing(self: Any, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return store(self, *args, **kwargs)
        except OperationalError as exc:
            first = args[0] if args else kwargs.get("message_id")
            refused_for_storage(exc, first if isinstance(first, str) else None, self.using)
            raise

    return refusing


#: A renewal's or acknowledgement's commit slower than this many seconds is a stalled disk (a
#: healthy commit takes milliseconds; fsync on a saturated or throttled volume takes seconds).
COMMIT_STALL_S = 2.0
#: Seconds without a slow commit before a stall is declared over (as STORAGE_FAULT_QUIET: fast
#: commits come between the slow ones of a disk that stalls again and again).
COMMIT_STALL_QUIET = STORAGE_FAULT_QUIET


#: Seconds after an outage's end in which a connection found broken is the outage's, not a new one.
STALE_GRACE = BACKOFF_MAX
#: What a driver says of a connection that broke earlier (not of the server now).
_STALE_MESSAGES = ("the connection is lost", "connection already closed", "the connection is closed")


def _is_stale(exc: BaseException) -> bool:
    return any(message in str(exc).lower() for message in _STALE_MESSAGES)


def is_outage(exc: BaseException) -> bool:
    if isinstance(exc, CONNECTION_ERRORS):
        return True
    cause = exc.__cause__ or exc
    return getattr(cause, "sqlstate", None) in _OUTAGE_SQLSTATES


class OutageTooLong(Exception):
    """The database stayed unreachable for longer than ``DB_OUTAGE_TOLERANCE``."""


def close_connection(alias: str) -> None:
    """Drop this thread's (broken) connection; the next query opens a new one."""
    conn = connections[alias]
    try:
        if conn.in_atomic_block:
            conn.set_rollback(True)
        conn.close()
    except Exception:
        conn.connection = None


class Backoff:
    """Capped exponential backoff with full jitter (so reconnecting workers do not stampede)."""

    def __init__(self, first: float = BACKOFF_FIRST, cap: float = BACKOFF_MAX) -> None:
        self.first = first
        self.cap = cap
        self.current = first

    def next(self) -> float:
        delay = random.uniform(self.current / 2, self.current)
        self.current = min(self.current * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.current = self.first


class OutageMonitor:
    """One per process and database alias: when the outage began, and its one log line."""

    _instances: dict[str, OutageMonitor] = {}
    _instances_lock = threading.Lock()

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._lock = threading.Lock()
        self.since: dt.datetime | None = None  # wall clock, for people
        self._since_monotonic: float | None = None
        self.last_error = ""
        self.outages = 0
        #: Whether the outage under way is a storage fault, and when its last refusal came.
        self.storage = False
        self._last_storage_error = 0.0
        self._recovered_at = float("-inf")
        #: When a slow commit (a stalled disk) was first and last seen; None: commits are fast.
        self.stalled_since: dt.datetime | None = None
        self._stall_began = 0.0
        self._last_slow = 0.0
        #: When each commit under way began (by thread; attempts with ``slow_after`` or
        #: ``watched``): one still waiting counts as slow, though it is not timed.
        self._committing: dict[int, float] = {}

    @classmethod
    def for_alias(cls, alias: str) -> OutageMonitor:
        with cls._instances_lock:
            monitor = cls._instances.get(alias)
            if monitor is None:
                monitor = cls._instances[alias] = cls(alias)
            return monitor

    @property
    def down_for(self) -> float:
        start = self._since_monotonic
        return 0.0 if start is None else time.monotonic() - start

    def failed(self, who: str, exc: BaseException) -> None:
        storage = is_storage_fault(exc)
        with self._lock:
            self.last_error = " ".join(str(exc).split())[:300] or type(exc).__name__
            if storage:
                self._last_storage_error = time.monotonic()
            if self._since_monotonic is not None:
                return
            if _is_stale(exc) and time.monotonic() - self._recovered_at < STALE_GRACE:
                # a thread that stayed idle meets the connection the outage just over broke
                return
            self._since_monotonic = time.monotonic()
            self.since = dt.datetime.now(dt.UTC)
            self.outages += 1
            self.storage = storage
        # WARNING: the process rides it out on its own; DB_OUTAGE_TOLERANCE's give-up is the ERROR.
        logger.warning(
            "database %r %s since %s (%s: %s); %s retries with backoff",
            self.alias,
            "storage fault" if storage else "unreachable",
            self.since.isoformat(timespec="seconds"),
            type(exc).__name__,
            self.last_error,
            who,
            extra={"database": self.alias, "worker": who},
        )

    def recovered(self) -> None:
        if self._since_monotonic is None:
            return
        with self._lock:
            if self._since_monotonic is None:
                return
            if self.storage and time.monotonic() - self._last_storage_error < STORAGE_FAULT_QUIET:
                return  # a statement that needed no new space: the disk may still be full
            down = time.monotonic() - self._since_monotonic
            self._recovered_at = time.monotonic()
            self._since_monotonic = None
            self.since = None
            storage, self.storage = self.storage, False
        logger.warning(
            "database %r %s after %.1fs",
            self.alias,
            "storage writable again" if storage else "reachable again",
            down,
            extra={"database": self.alias},
        )

    def timed(self, who: str, took: float, slow_after: float) -> None:
        """A commit of ``who`` took ``took`` seconds: log a stall once at its start (the first
        commit slower than ``slow_after``) and once at its end (:meth:`stall_over`), never per
        commit."""
        if took <= slow_after:
            self.stall_over()
            return
        now = time.monotonic()
        with self._lock:
            self._last_slow = now
            if self.stalled_since is not None:
                return
            self.stalled_since = dt.datetime.now(dt.UTC)
            self._stall_began = now - took
        logger.warning(
            "database %r storage stalled since %s: a commit of %s took %.1fs (more than %gs); "
            "leases may expire meanwhile",
            self.alias,
            self.stalled_since.isoformat(timespec="seconds"),
            who,
            took,
            slow_after,
            extra={"database": self.alias, "worker": who},
        )

    def stall_over(self) -> None:
        """End a stall once ``COMMIT_STALL_QUIET`` seconds passed without a slow commit (called
        after a fast commit, and by the lease keeper when it has nothing to commit)."""
        if self.stalled_since is None:
            return
        with self._lock:
            now = time.monotonic()
            # A commit is timed when it returns: one still waiting past COMMIT_STALL_S is a
            # slow commit now (a single commit can outlast COMMIT_STALL_QUIET).
            waiting = any(now - began > COMMIT_STALL_S for began in self._committing.values())
            if self.stalled_since is None or waiting or now - self._last_slow < COMMIT_STALL_QUIET:
                return
            self.stalled_since = None
            lasted = self._last_slow - self._stall_began
        logger.warning(
            "database %r storage commits fast again after %.1fs",
            self.alias,
            lasted,
            extra={"database": self.alias},
        )

    def status(self) -> str:
        """``""`` while healthy, else ``"database unreachable since <time>: <error>"`` (``"database
        storage fault since ..."`` when its disk refuses writes)."""
        since = self.since
        if since is None:
            return ""
        what = "storage fault" if self.storage else "unreachable"
        return f"database {what} since {since.isoformat(timespec='seconds')}: {self.last_error}"

    def attempt(
        self,
        work: Callable[[], T],
        *,
        who: str,
        backoff: Backoff,
        wait: Callable[[float], object],
        tolerance: float | None,
        slow_after: float | None = None,
        watched: bool = False,
    ) -> tuple[bool, T | None]:
        """Run ``work`` once. ``(True, result)`` on success; on an outage, back off (through
        ``wait``, which returns early when the loop is stopping) and return ``(False, None)``.
        With ``slow_after``, ``work`` is a commit: one slower than that is a stall (:meth:`timed`).
        ``watched``: a commit not timed (a claim: its query's time too), which nevertheless keeps
        a stall on while it waits longer than COMMIT_STALL_S.

        Raises :class:`OutageTooLong` past ``tolerance``; other exceptions propagate.
        """
        began = time.monotonic()
        thread = threading.get_ident()
        watched = watched or slow_after is not None
        if watched:
            with self._lock:
                self._committing[thread] = began
        try:
            try:
                result = work()
            finally:
                if watched:
                    with self._lock:
                        self._committing.pop(thread, None)
        except BaseException as exc:
            if not is_outage(exc):
                raise
            self.failed(who, exc)
            close_connection(self.alias)
            if tolerance is not None and self.down_for > tolerance:
                raise OutageTooLong(
                    f"database {self.alias!r} unreachable for {self.down_for:.0f}s "
                    f"(DB_OUTAGE_TOLERANCE={tolerance:g}s): {self.last_error}"
                ) from exc
            wait(backoff.next())
            return False, None
        backoff.reset()
        self.recovered()
        if slow_after is not None:
            self.timed(who, time.monotonic() - began, slow_after)
        return True, result
