"""Public path of the storage-fault classifier (docs/guarantees.md): defined in :mod:`zeroloss.core.outage`."""

from .core.outage import is_outage, is_storage_fault

__all__ = ["is_outage", "is_storage_fault"]
