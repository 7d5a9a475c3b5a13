"""Public path of the health checks (docs/operations.md: ``"zeroloss.health.ZeroLossHealthCheck"``):
defined in :mod:`zeroloss.ops.health`."""

from __future__ import annotations

from typing import Any

from .ops import health_adapters as _adapters
from .ops.health import HealthReport, health_report, health_view, live_view, ready_view

__all__ = ["HealthReport", "health_report", "health_view", "live_view", "ready_view"]


def __getattr__(name: str) -> Any:
    # ZeroLossHealthCheck and ZeroLossHealthCheckBackend exist only with django-health-check installed.
    if name in {"ZeroLossHealthCheck", "ZeroLossHealthCheckBackend"}:
        return getattr(_adapters, name)
    raise AttributeError(f"module 'zeroloss.health' has no attribute {name!r}")
