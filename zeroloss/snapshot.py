"""Public path of the ledger's snapshot (docs/operations.md): defined in :mod:`zeroloss.ops.snapshot`."""

from .ops.snapshot import QueueSnapshot, Snapshot, get_snapshot

__all__ = ["QueueSnapshot", "Snapshot", "get_snapshot"]
