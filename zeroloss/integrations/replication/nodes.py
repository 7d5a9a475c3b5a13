"""The node registry: which replication nodes exist and when each was last seen (shared by every
instance through the database). The registry never counts as a copy: copies are measured."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from ...exceptions import InvalidMessage
from ...ledger.models import NodeRole, ReplicationNode
from ...ledger.validation import canonical_json, validate_message_id
from . import statements

if TYPE_CHECKING:
    from ...ledger.service import ZeroLossMessageService


def _check_node_id(node_id: Any) -> str:
    """A node id follows the rules of a message id: a non-empty string of at most 255
    characters, without control characters (NUL: PostgreSQL refuses it) or lone surrogates."""
    return validate_message_id(node_id, "node_id")


def _check_address(address: Any) -> str:
    if not isinstance(address, str) or len(address) > 255:
        raise InvalidMessage(f"address must be a string of at most 255 characters, got {address!r}.")
    if address:
        validate_message_id(address, "address")
    return address


def _encode_metadata(metadata: Any) -> str:
    """The metadata as the JSON that is stored. :class:`~zeroloss.exceptions.InvalidPayload`
    (an ``InvalidMessage``) for NaN or infinity (jsonb and SQLite's JSON_VALID refuse them),
    NUL, lone surrogates, or nesting deeper than payloads may be."""
    if metadata is None:
        return "{}"
    if not isinstance(metadata, dict):
        raise InvalidMessage(f"metadata must be a dict, got {type(metadata).__name__}.")
    return canonical_json(metadata)


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
    if not isinstance(role, str) or role not in NodeRole.values:
        raise InvalidMessage(f"role must be one of {NodeRole.values}, got {role!r}.")
    _check_address(address)
    encoded = _encode_metadata(metadata)
    service.engine.run(
        service.connection,
        statements,
        "REGISTER_NODE",
        {
            "node_id": node_id,
            "address": address,
            "role": role,
            "metadata": encoded,
            "state": state,
            "sync_state": sync_state,
            "flush_lsn": flush_lsn,
            "replay_lsn": replay_lsn,
        },
    )
    return ReplicationNode.objects.using(service.using).get(node_id=node_id)


def heartbeat(service: ZeroLossMessageService, node_id: str) -> bool:
    _check_node_id(node_id)
    _, count = service.engine.run(service.connection, statements, "HEARTBEAT", {"node_id": node_id})
    return count == 1


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
