"""Replication that tells the truth.

Copies are *measured* from PostgreSQL's own streaming replication
(``pg_stat_replication`` on the primary), never inferred from a configured number or
from the node registry. The registry records which nodes exist and when they were last
seen; it never counts as a copy by itself.

A message's ``commit_lsn`` is a WAL position at or after its commit record: a standby
whose ``replay_lsn`` has reached it holds the message and can serve it to readers.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import transaction

from .exceptions import InvalidMessage, ReplicationTimeout
from .models import Message, NodeRole, ReplicationNode

if TYPE_CHECKING:
    from .service import ReplicationStatus, ZeroLossMessageService

NODE = ReplicationNode._meta.db_table
MSG = Message._meta.db_table


@dataclass(frozen=True)
class Requirement:
    """Whether the configured replication can be met right now."""

    required: int  # standbys needed (REPLICATION_FACTOR - 1)
    available: int  # standbys streaming now
    ok: bool
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Standby:
    application_name: str
    client_addr: str
    state: str
    sync_state: str
    flush_lsn: int | None
    replay_lsn: int | None


def _check_node_id(node_id: Any) -> str:
    if not isinstance(node_id, str) or not node_id.strip() or len(node_id) > 255:
        raise InvalidMessage(
            f"node_id must be a non-empty string of at most 255 characters, got {node_id!r}."
        )
    return node_id


def register_node(
    service: ZeroLossMessageService,
    node_id: str,
    *,
    address: str = "",
    role: str = NodeRole.NODE,
    metadata: dict[str, Any] | None = None,
    state: str = "",
    sync_state: str = "",
    flush_lsn: int | None = None,
    replay_lsn: int | None = None,
) -> ReplicationNode:
    _check_node_id(node_id)
    if role not in NodeRole.values:
        raise InvalidMessage(f"role must be one of {NodeRole.values}, got {role!r}.")
    if not isinstance(address, str) or len(address) > 255:
        raise InvalidMessage(f"address must be a string of at most 255 characters, got {address!r}.")
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidMessage(f"metadata must be a dict, got {type(metadata).__name__}.")
    try:
        encoded = json.dumps(metadata or {}, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise InvalidMessage(f"metadata is not JSON-serialisable: {exc}.") from exc
    d = service.dialect
    with service.connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {NODE} (node_id, address, role, metadata, state, sync_state, flush_lsn, replay_lsn, "
            f"registered_at, last_seen_at) VALUES (%s, %s, %s, %s{d.json_cast}, %s, %s, %s, %s, {d.now}, {d.now}) "
            "ON CONFLICT (node_id) DO UPDATE SET address = EXCLUDED.address, role = EXCLUDED.role, "
            "metadata = EXCLUDED.metadata, state = EXCLUDED.state, sync_state = EXCLUDED.sync_state, "
            "flush_lsn = EXCLUDED.flush_lsn, replay_lsn = EXCLUDED.replay_lsn, last_seen_at = EXCLUDED.last_seen_at",
            [node_id, address, role, encoded, state, sync_state, flush_lsn, replay_lsn],
        )
    return ReplicationNode.objects.using(service.using).get(node_id=node_id)


def heartbeat(service: ZeroLossMessageService, node_id: str) -> bool:
    _check_node_id(node_id)
    with service.connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {NODE} SET last_seen_at = {service.dialect.now} WHERE node_id = %s", [node_id]
        )
        return cursor.rowcount == 1


def unregister_node(service: ZeroLossMessageService, node_id: str) -> bool:
    _check_node_id(node_id)
    deleted, _ = ReplicationNode.objects.using(service.using).filter(node_id=node_id).delete()
    return deleted > 0


def live_cutoff(service: ZeroLossMessageService) -> dt.datetime:
    return service.database_now() - dt.timedelta(seconds=service.settings.NODE_TTL)


def is_live(node: ReplicationNode, cutoff: dt.datetime) -> bool:
    return node.last_seen_at >= cutoff


def live_nodes(service: ZeroLossMessageService) -> list[ReplicationNode]:
    return list(
        ReplicationNode.objects.using(service.using)
        .filter(last_seen_at__gte=live_cutoff(service))
        .order_by("node_id")
    )


def node_counts(service: ZeroLossMessageService) -> tuple[int, int]:
    cutoff = live_cutoff(service)
    nodes = ReplicationNode.objects.using(service.using)
    live = nodes.filter(last_seen_at__gte=cutoff).count()
    return live, nodes.count() - live


def streaming_standbys(service: ZeroLossMessageService) -> list[Standby]:
    """The primary's view of its standbys. Empty on SQLite and on a lone PostgreSQL."""
    if service.connection.vendor != "postgresql":
        return []
    with service.connection.cursor() as cursor:
        cursor.execute(
            "SELECT application_name, COALESCE(host(client_addr), 'local'), state, sync_state, "
            "(flush_lsn - '0/0'::pg_lsn)::bigint, (replay_lsn - '0/0'::pg_lsn)::bigint "
            "FROM pg_stat_replication ORDER BY application_name"
        )
        return [Standby(r[0] or "", r[1], r[2] or "", r[3] or "", r[4], r[5]) for r in cursor.fetchall()]


def requirement(service: ZeroLossMessageService, standbys: Sequence[Standby] | None = None) -> Requirement:
    cfg = service.settings
    required = cfg.REPLICATION_FACTOR - 1
    if required == 0 and cfg.PERSISTENCE_LEVEL == "durable":
        return Requirement(0, 0, True)
    if service.connection.vendor != "postgresql":
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
    available = sum(1 for s in standbys if s.state == "streaming")
    problems = []
    if available < required:
        problems.append(
            f"Only {available} streaming standby(s); REPLICATION_FACTOR={cfg.REPLICATION_FACTOR} needs {required}."
        )
    return Requirement(required, available, not problems, problems)


def current_lsn(service: ZeroLossMessageService) -> int:
    with service.connection.cursor() as cursor:
        cursor.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint")
        return int(cursor.fetchone()[0])


def _record_lsn(service: ZeroLossMessageService, message_pks: Sequence[int], lsn: int) -> None:
    # Metadata, not a state transition: the first bound observed after commit is kept.
    with service.connection.cursor() as cursor:
        marks = ",".join(["%s"] * len(message_pks))
        cursor.execute(
            f"UPDATE {MSG} SET commit_lsn = %s WHERE id IN ({marks}) AND commit_lsn IS NULL",
            [lsn, *message_pks],
        )


def measure(service: ZeroLossMessageService, message: Message | None) -> ReplicationStatus:
    """Copies of ``message`` (or of everything committed so far) that exist right now."""
    from .service import ReplicationStatus

    required = service.settings.REPLICATION_FACTOR
    if service.connection.vendor != "postgresql":
        return ReplicationStatus(1, required, True, f"{service.connection.vendor} keeps a single copy")
    if message is not None and message.commit_lsn is None:
        lsn = current_lsn(service)
        _record_lsn(service, [message.pk], lsn)
        message.commit_lsn = lsn
    target = message.commit_lsn if message is not None else current_lsn(service)
    assert target is not None
    standbys = streaming_standbys(service)
    confirmed_by = [
        s.application_name for s in standbys if s.replay_lsn is not None and s.replay_lsn >= target
    ]
    if not standbys:
        detail = "no streaming standby is attached to the primary"
    else:
        detail = f"{len(confirmed_by)} of {len(standbys)} standby(s) replayed this position"
    return ReplicationStatus(1 + len(confirmed_by), required, True, detail, confirmed_by)


def confirm(service: ZeroLossMessageService, messages: Sequence[Message]) -> None:
    """``"replicated"`` persistence: wait until REPLICATION_FACTOR - 1 standbys replayed the commit."""
    if not messages:
        return
    conn = service.connection
    if conn.in_atomic_block:
        # Not committed yet, so nothing can be confirmed; record the position once it is.
        pks = [m.pk for m in messages]
        transaction.on_commit(lambda: _record_lsn(service, pks, current_lsn(service)), using=service.using)
        return
    cfg = service.settings
    required = cfg.REPLICATION_FACTOR - 1
    if conn.vendor != "postgresql":
        raise ReplicationTimeout(messages[0].message_id, 1, cfg.REPLICATION_FACTOR, 0)
    lsn = current_lsn(service)
    _record_lsn(service, [m.pk for m in messages], lsn)
    for m in messages:
        m.commit_lsn = m.commit_lsn or lsn
    deadline = time.monotonic() + cfg.REPLICATION_TIMEOUT
    pause = 0.0005
    while True:
        confirmed = sum(
            1 for s in streaming_standbys(service) if s.replay_lsn is not None and s.replay_lsn >= lsn
        )
        if confirmed >= required:
            return
        if time.monotonic() >= deadline:
            raise ReplicationTimeout(
                messages[0].message_id, 1 + confirmed, cfg.REPLICATION_FACTOR, cfg.REPLICATION_TIMEOUT
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


def discover(service: ZeroLossMessageService) -> list[ReplicationNode]:
    """Register every standby the primary streams to, with its state and positions."""
    nodes = []
    for s in streaming_standbys(service):
        name = s.application_name or s.client_addr
        nodes.append(
            register_node(
                service,
                name,
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
