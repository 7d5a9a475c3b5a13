"""Public path of what a handler receives (docs/handlers.md): defined in :mod:`zeroloss.runtime.delivery`."""

from .runtime.delivery import Aborted, Delivery, LeaseLost

__all__ = ["Aborted", "Delivery", "LeaseLost"]
