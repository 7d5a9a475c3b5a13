"""Public path of the registry every process records into (docs/observability.md): defined in
:mod:`zeroloss.integrations.telemetry.prometheus`."""

from ..integrations.telemetry.prometheus import registry

__all__ = ["registry"]
