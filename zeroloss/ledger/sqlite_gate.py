"""A fair turn at SQLite's write lock between the processes that share a database file.

SQLite's busy handler polls with a back-off of up to 100 ms, so a process that commits and
begins its next write transaction at once keeps winning the lock while another one waits for
seconds; a waiting worker's lease renewals then cannot commit and its leases lapse. Here every
transaction Django's ``atomic`` starts with ``BEGIN IMMEDIATE`` (``transaction_mode``, W003) on
a connection the ledger has used, and every ledger write statement outside a transaction, first
takes the *gate*, an ``flock`` on a file next to the database, and holds it until it ends. A second file is the *turn*: a process takes
it before the gate and lets it go once it has the gate, so the one waiting for the gate holds
the turn and a process that just released the gate queues behind it instead of taking it again.

The gate only orders writers: SQLite's own lock still guards every write. A gate not obtained
within the connection's ``timeout`` (a holder in the same process waiting on this thread, a
writer outside Django) is passed by, leaving the wait to SQLite as without it.
"""

from __future__ import annotations

import fcntl
import os
import time
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

_GATE = "_zeroloss_write_gate"
_POLL = 0.001  # between tries at a lock; the gate is passed in turn, so this is no race to win


class WriteGate:
    """The gate and the turn of one connection wrapper (one thread): its own open files,
    since ``flock`` locks belong to an open file and so also exclude the process's other threads."""

    def __init__(self, database: str, timeout: float) -> None:
        self.pid = os.getpid()
        self.timeout = timeout
        # File objects, not bare descriptors: a wrapper dropped with its thread closes them.
        self._files = [open(f"{database}-zeroloss-{name}", "ab") for name in ("turn", "gate")]  # noqa: SIM115
        self.turn, self.gate = (f.fileno() for f in self._files)
        self.held = False

    def enter(self) -> None:
        """Take the gate, in turn; give up after ``timeout`` (then SQLite's lock decides alone)."""
        if self.held:
            return
        deadline = time.monotonic() + self.timeout
        if not _take(self.turn, deadline):
            return
        try:
            self.held = _take(self.gate, deadline)
        finally:
            fcntl.flock(self.turn, fcntl.LOCK_UN)

    def leave(self) -> None:
        if self.held:
            self.held = False
            fcntl.flock(self.gate, fcntl.LOCK_UN)

    def close(self, *, inherited: bool = False) -> None:
        # An inherited copy shares the parent's open files: unlocking it would free the parent's lock.
        if not inherited:
            self.leave()
        for f in self._files:
            f.close()


def _take(fd: int, deadline: float) -> bool:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)


def gate_of(conn: BaseDatabaseWrapper) -> WriteGate | None:
    """The write gate of ``conn`` (a SQLite connection wrapper), set up on first use: its
    transactions take it from ``BEGIN`` until they end. None for an in-memory database or where
    the files cannot be made."""
    state = conn.__dict__.get(_GATE)
    if isinstance(state, WriteGate):
        if state.pid == os.getpid():
            return state
        state.close(inherited=True)
    elif _GATE in conn.__dict__:
        return None  # no gate for this database
    gate = _open(conn)
    conn.__dict__[_GATE] = gate
    if gate is not None and not isinstance(state, WriteGate):
        _hook(conn)
    return gate


def _open(conn: Any) -> WriteGate | None:
    if conn.is_in_memory_db():
        return None
    options = conn.settings_dict.get("OPTIONS") or {}
    try:
        return WriteGate(str(conn.settings_dict["NAME"]), float(options.get("timeout", 5.0)))
    except OSError:
        return None


def _hook(conn: Any) -> None:
    """Wrap the wrapper's own transaction start and end (instance attributes over the class's)."""
    begin, set_autocommit, close = (
        conn._start_transaction_under_autocommit,
        conn._set_autocommit,
        conn._close,
    )

    def _start_transaction_under_autocommit() -> None:
        # Only a BEGIN that takes the write lock (a DEFERRED one may only read) waits its turn.
        gate = gate_of(conn) if conn.transaction_mode in ("IMMEDIATE", "EXCLUSIVE") else None
        if gate is not None:
            gate.enter()
        try:
            begin()
        except BaseException:
            _leave(conn)
            raise

    def _set_autocommit(autocommit: bool) -> None:
        try:
            set_autocommit(autocommit)
        finally:
            if autocommit:
                _leave(conn)

    def _close() -> None:
        try:
            close()
        finally:
            _leave(conn)

    conn._start_transaction_under_autocommit = _start_transaction_under_autocommit
    conn._set_autocommit = _set_autocommit
    conn._close = _close


def _leave(conn: BaseDatabaseWrapper) -> None:
    gate = conn.__dict__.get(_GATE)
    if isinstance(gate, WriteGate) and gate.pid == os.getpid():
        gate.leave()
