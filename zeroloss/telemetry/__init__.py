"""Public path of the Prometheus registry (docs/observability.md); telemetry lives in
:mod:`zeroloss.integrations.telemetry`."""
