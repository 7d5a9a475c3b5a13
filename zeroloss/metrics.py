"""Public path of the scrape-time Prometheus metrics (docs/operations.md): defined in
:mod:`zeroloss.ops.metrics`."""

from .ops.metrics import metrics_view, register_default, unregister_default

__all__ = ["metrics_view", "register_default", "unregister_default"]
