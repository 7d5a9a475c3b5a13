"""The replication node registry, as seen from the service (the registry itself: zeroloss.integrations.replication)."""

from __future__ import annotations

from typing import Any

from .base import Part
from .hooks import replication
from .models import ReplicationNode


class Nodes(Part):
    """The replication node registry, through the replication hooks."""

    def register_replication_node(
        self, node_id: str, address: str = "", *, role: str = "node", metadata: dict[str, Any] | None = None
    ) -> ReplicationNode:
        """Register a node, or refresh it (idempotent upsert); counts as a heartbeat."""
        return replication().register_node(
            self.ctx.service, node_id, address=address, role=role, metadata=metadata
        )

    def heartbeat_node(self, node_id: str) -> bool:
        """Record that a registered node is alive; False if it is not registered."""
        return replication().heartbeat(self.ctx.service, node_id)

    def unregister_replication_node(self, node_id: str) -> bool:
        """Remove a node from the registry; False if it was not registered."""
        return replication().unregister_node(self.ctx.service, node_id)

    def get_replication_targets(self) -> list[ReplicationNode]:
        """Live nodes, ordered by node id, at most ``REPLICATION_FACTOR`` of them."""
        return replication().live_nodes(self.ctx.service)[: self.settings.REPLICATION_FACTOR]
