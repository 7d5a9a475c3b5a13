"""The node registry: which replication nodes exist and when each was last seen (shared by every
instance through the database). The registry never counts as a copy: copies are measured."""

from __future__ import annotations

import datetime as dt
import json
from typing import TYPE_CHECKING, Any

from ..exceptions import InvalidMessage
from ..models import NodeRole, ReplicationNode

if TYPE_CHECKING:
    from ..ledger.base import LedgerBase as ZeroLossMessageService

NODE = ReplicationNode._meta.db_table


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
    """Idempotent upsert; counts as a heartbeat. The registry never counts as a copy."""
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
    e = service.engine
    with service.connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {NODE} (node_id, address, role, metadata, state, sync_state, flush_lsn, replay_lsn, "
            f"registered_at, last_seen_at) VALUES (%s, %s, %s, %s{e.jsonb}, %s, %s, %s, %s, {e.now}, {e.now}) "
            "ON CONFLICT (node_id) DO UPDATE SET address = EXCLUDED.address, role = EXCLUDED.role, "
            "metadata = EXCLUDED.metadata, state = EXCLUDED.state, sync_state = EXCLUDED.sync_state, "
            "flush_lsn = EXCLUDED.flush_lsn, replay_lsn = EXCLUDED.replay_lsn, last_seen_at = EXCLUDED.last_seen_at",
            [node_id, address, role, encoded, state, sync_state, flush_lsn, replay_lsn],
        )
    return ReplicationNode.objects.using(service.using).get(node_id=node_id)


def heartbeat(service: ZeroLossMessageService, node_id: str) -> bool:
    _check_node_id(node_id)
    with service.connection.cursor() as cursor:
        cursor.execute(f"UPDATE {NODE} SET last_seen_at = {service.engine.now} WHERE node_id = %s", [node_id])
        return cursor.rowcount == 1


def unregister_node(service: ZeroLossMessageService, node_id: str) -> bool:
    _check_node_id(node_id)
    deleted, _ = ReplicationNode.objects.using(service.using).filter(node_id=node_id).delete()
    return deleted > 0


def live_cutoff(service: ZeroLossMessageService) -> dt.datetime:
    """Nodes last seen before this (database clock) are down."""
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
