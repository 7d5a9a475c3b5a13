"""Replication that tells the truth.

Copies are *measured* from PostgreSQL's own streaming replication (``pg_stat_replication``
on the primary), never inferred from a configured number or from the node registry. The
registry records which nodes exist and when they were last seen; it never counts as a copy.

A message's ``commit_lsn`` is a WAL position at or after its commit record: a physical
standby whose reported ``replay_lsn`` has reached it holds the message and serves it to
readers. Positions are recorded by a small *marker* transaction committed with
``synchronous_commit = remote_apply``: its commit record asks every standby to report its
replay position the moment it replays it, so confirmation never waits for the standby's
periodic status message (``wal_receiver_status_interval``, 10 s by default).

Only physical walsenders count: logical subscribers, ``pg_receivewal`` and base backups
appear in ``pg_stat_replication`` too, but do not hold a readable copy of the ledger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import transaction

from ...exceptions import ReplicationTimeout
from ...ledger.hooks import ReplicationHooks
from ...ledger.models import Message, NodeRole, ReplicationNode
from . import statements
from .nodes import heartbeat, is_live, live_cutoff, live_nodes, node_counts, register_node, unregister_node

if TYPE_CHECKING:
    from ...ledger.service import ZeroLossMessageService

__all__ = [
    "ReplicationStatus",
    "Requirement",
    "Standby",
    "confirm",
    "current_lsn",
    "discover",
    "format_lsn",
    "heartbeat",
    "hooks",
    "in_recovery",
    "is_live",
    "live_cutoff",
    "live_nodes",
    "measure",
    "node_counts",
    "record_commit",
    "register_node",
    "requirement",
    "streaming_standbys",
    "unregister_node",
]

logger = logging.getLogger("zeroloss")


#: WAL page headers (PostgreSQL's SizeOfXLogShortPHD / SizeOfXLogLongPHD on 64-bit builds).
_SHORT_PAGE_HEADER = 24
_LONG_PAGE_HEADER = 40


@dataclass(frozen=True)
class ReplicationStatus:
    """Copies of a message that were *measured*, never configured ones."""

    confirmed: int
    required: int
    measured: bool
    detail: str = ""
    confirmed_by: list[str] = field(default_factory=list)

    @property
    def sufficient(self) -> bool:
        return self.confirmed >= self.required


@dataclass(frozen=True)
class Requirement:
    """Whether the configured replication can be met right now."""

    required: int  # standbys needed (REPLICATION_FACTOR - 1)
    available: int  # physical standbys streaming now
    ok: bool
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Standby:
    """One row of the primary's ``pg_stat_replication``."""

    application_name: str
    client_addr: str
    state: str
    sync_state: str
    flush_lsn: int | None
    replay_lsn: int | None
    #: A physical standby (not a logical subscriber, which is connected to a database).
    physical: bool = True
    #: False when this role may not read the row's details (it needs ``pg_monitor``).
    visible: bool = True

    @property
    def streaming(self) -> bool:
        return self.physical and self.state == "streaming" and self.replay_lsn is not None

    def holds(self, lsn: int) -> bool:
        return self.physical and self.replay_lsn is not None and self.replay_lsn >= lsn


def format_lsn(lsn: int | None) -> str:
    """``12345678`` -> ``0/BC614E``, PostgreSQL's own notation."""
    if lsn is None:
        return ""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


# -- measuring --------------------------------------------------------------------------


def _replicates(service: ZeroLossMessageService) -> bool:
    return service.engine.supports_replication


def _run(
    service: ZeroLossMessageService, name: str, params: Mapping[str, Any] | None = None
) -> list[tuple[Any, ...]]:
    """The rows of the named statement of :mod:`.statements`, run on ``service``'s connection."""
    return service.engine.run(service.connection, statements, name, params or {})[0]


def in_recovery(service: ZeroLossMessageService) -> bool:
    """True when the connection points at a standby rather than the primary."""
    if not _replicates(service):
        return False
    return bool(_run(service, "IN_RECOVERY")[0][0])


def streaming_standbys(service: ZeroLossMessageService) -> list[Standby]:
    """The primary's view of its walsenders. Empty on SQLite and on a lone PostgreSQL."""
    if not _replicates(service):
        return []
    return [
        Standby(r[0] or "", r[1], r[2] or "", r[3] or "", r[4], r[5], bool(r[6]), bool(r[7]))
        for r in _run(service, "STANDBYS")
    ]


def _visibility_problem(standbys: Sequence[Standby]) -> str:
    hidden = sum(1 for s in standbys if not s.visible)
    if not hidden:
        return ""
    return (
        f"{hidden} walsender(s) are hidden from this database role: it cannot read pg_stat_replication "
        "(GRANT pg_monitor TO <role>), so their copies cannot be measured."
    )


def requirement(service: ZeroLossMessageService, standbys: Sequence[Standby] | None = None) -> Requirement:
    """Can REPLICATION_FACTOR be met right now? Measured, never configured."""
    cfg = service.settings
    required = cfg.REPLICATION_FACTOR - 1
    if required == 0:
        return Requirement(0, 0, True)
    if not _replicates(service):
        return Requirement(
            required,
            0,
            False,
            [
                f"{service.connection.vendor} cannot replicate: REPLICATION_FACTOR={cfg.REPLICATION_FACTOR} "
                f"and PERSISTENCE_LEVEL={cfg.PERSISTENCE_LEVEL!r} cannot be met (one copy exists)."
            ],
        )
    if standbys is None:
        standbys = streaming_standbys(service)
    available = sum(1 for s in standbys if s.streaming)
    problems = []
    if available < required:
        problems.append(
            f"Only {available} streaming standby(s); REPLICATION_FACTOR={cfg.REPLICATION_FACTOR} needs {required}."
        )
        if cfg.PERSISTENCE_LEVEL == "replicated":
            problems.append(
                "Every 'replicated' persist will raise ReplicationTimeout until enough standbys stream."
            )
    hidden = _visibility_problem(standbys)
    if hidden:
        problems.append(hidden)
    return Requirement(required, available, not problems, problems)


def _normalise(lsn: int, block_size: int, segment_size: int) -> int:
    # pg_current_wal_insert_lsn() is the start of the next record; when that falls just after
    # a page header, the last record ended at the page boundary, which is what a standby
    # reports as replayed. Without this, a confirmation could wait for unrelated WAL.
    if lsn % segment_size == _LONG_PAGE_HEADER:
        return lsn - _LONG_PAGE_HEADER
    if lsn % block_size == _SHORT_PAGE_HEADER:
        return lsn - _SHORT_PAGE_HEADER
    return lsn


def _insert_lsn(service: ZeroLossMessageService) -> int:
    """A WAL position at or after the end of every commit visible now (normalised)."""
    [(lsn, block, segment)] = _run(service, "INSERT_LSN")
    return _normalise(int(lsn), int(block), int(segment))


def _has_written(service: ZeroLossMessageService) -> bool:
    return bool(_run(service, "HAS_WRITTEN")[0][0])


def current_lsn(service: ZeroLossMessageService) -> int:
    return _insert_lsn(service)


def record_commit(service: ZeroLossMessageService, messages: Sequence[Message], timeout: float) -> int:
    """Record a WAL bound for ``messages`` (all committed) and ask standbys to report replay at once.

    One short transaction: read the insert position (after every visible commit), store it in
    ``commit_lsn`` where none is recorded yet (the first, tightest bound is kept), and commit
    with ``synchronous_commit = remote_apply`` so each standby reports the moment it replays
    this commit, which lies after the target. Returns the target position.
    """
    pks = [m.pk for m in messages]
    with transaction.atomic(using=service.using):
        # If the primary has synchronous_standby_names, COMMIT waits for them: bound it.
        _run(service, "REPORT_REPLAY", {"timeout_ms": str(max(int(timeout * 1000), 1))})
        target = _insert_lsn(service)
        if pks:
            _run(service, "RECORD_LSN", {"lsn": target, "ids": pks})
        _run(service, "WRITE_COMMIT")
        if pks:
            recorded = dict(_run(service, "RECORDED_LSNS", {"ids": pks}))
            for m in messages:
                m.commit_lsn = recorded.get(m.pk, target)
    return target


def measure(
    service: ZeroLossMessageService, message: Message | None, *, record: bool = True
) -> ReplicationStatus:
    """Copies of ``message`` (or of everything committed so far) that exist right now.

    A message without a recorded commit position gets one on its first measurement (one short
    write, which also makes standbys report replay at once). ``record=False`` writes nothing:
    it measures against the current WAL position, a later (conservative) bound, so it may
    count fewer copies than a recorded bound would; read-only pages use it.
    """
    required = service.settings.REPLICATION_FACTOR
    if not _replicates(service):
        vendor = service.connection.vendor
        return ReplicationStatus(1, required, True, f"{vendor} keeps a single copy: it cannot replicate")
    if in_recovery(service):
        return ReplicationStatus(
            1,
            required,
            False,
            "connected to a standby in recovery: copies can only be measured on the primary",
        )
    target: int | None = message.commit_lsn if message is not None else None
    if message is not None and target is None:
        if record and not service.connection.in_atomic_block:
            # A "durable" message: its first verification records a conservative (later) bound.
            record_commit(service, [message], service.settings.REPLICATION_TIMEOUT)
            target = message.commit_lsn
        elif _has_written(service):
            # The message may be this transaction's own uncommitted write: no bound exists yet.
            return ReplicationStatus(
                1, required, False, "inside a transaction that has written: measurable once it commits"
            )
    if target is None:
        target = _insert_lsn(service)
    standbys = streaming_standbys(service)
    confirmed_by = [s.application_name or s.client_addr for s in standbys if s.holds(target)]
    physical = [s for s in standbys if s.physical]
    hidden = _visibility_problem(standbys)
    if hidden:
        detail = hidden
    elif not physical:
        detail = "no streaming standby is attached to the primary: PostgreSQL holds a single copy"
    else:
        detail = (
            f"{len(confirmed_by)} of {len(physical)} standby(s) replayed WAL position {format_lsn(target)}"
        )
    return ReplicationStatus(1 + len(confirmed_by), required, not hidden, detail, confirmed_by)


def confirm(service: ZeroLossMessageService, messages: Sequence[Message]) -> None:
    """``"replicated"`` persistence: wait until REPLICATION_FACTOR - 1 standbys replayed the commit.

    Raises :class:`ReplicationTimeout` (the messages stay committed on the primary) when they
    do not within ``REPLICATION_TIMEOUT``. Inside ``transaction.atomic`` nothing is committed
    yet, so the wait runs when the outermost block commits and the error is raised from there.
    """
    if not messages:
        return
    cfg = service.settings
    required = cfg.REPLICATION_FACTOR - 1
    if required == 0:
        return  # one copy is all that is asked, and the primary holds it
    conn = service.connection
    if conn.in_atomic_block:
        pending = list(messages)
        transaction.on_commit(lambda: confirm(service, pending), using=service.using)
        return
    if not _replicates(service):
        raise ReplicationTimeout(messages[0].message_id, 1, cfg.REPLICATION_FACTOR, 0)
    deadline = time.monotonic() + cfg.REPLICATION_TIMEOUT
    target = record_commit(service, messages, cfg.REPLICATION_TIMEOUT)
    pause = 0.0005
    while True:
        confirmed = sum(1 for s in streaming_standbys(service) if s.holds(target))
        if confirmed >= required:
            return
        if time.monotonic() >= deadline:
            raise ReplicationTimeout(
                messages[0].message_id, 1 + confirmed, cfg.REPLICATION_FACTOR, cfg.REPLICATION_TIMEOUT
            )
        time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
        pause = min(pause * 2, 0.02)


def discover(service: ZeroLossMessageService) -> list[ReplicationNode]:
    """Register (and heartbeat) every physical standby the primary streams to, with its positions.

    A standby that disconnects is no longer refreshed and turns down after ``NODE_TTL``.
    """
    nodes = []
    for s in streaming_standbys(service):
        if not s.physical or not s.visible:
            continue
        name = s.application_name or f"standby@{s.client_addr}"
        nodes.append(
            register_node(
                service,
                name[:255],
                address=s.client_addr,
                role=NodeRole.STANDBY,
                metadata={"discovered_from": "pg_stat_replication"},
                state=s.state,
                sync_state=s.sync_state,
                flush_lsn=s.flush_lsn,
                replay_lsn=s.replay_lsn,
            )
        )
    return nodes


def hooks() -> ReplicationHooks:
    """These functions as the ledger's replication hooks (installed by the app's ``ready()``)."""
    return ReplicationHooks(
        confirm=confirm,
        measure=measure,
        register_node=register_node,
        heartbeat=heartbeat,
        unregister_node=unregister_node,
        live_nodes=live_nodes,
        discover=discover,
    )
