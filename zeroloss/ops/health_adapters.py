"""zeroloss's checks for django-health-check (an optional dependency, which imports Redis's client
and through it OpenTelemetry's SDK): kept out of :mod:`.health`, which the system checks import, so
that nothing is imported until a project names these (``zeroloss.health.ZeroLossHealthCheck``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from ..ledger.service import ZeroLossMessageService
from .health import HealthReport, health_report

try:  # django-health-check >= 4: dataclass checks listed on HealthCheckView(checks=[...])
    from health_check.base import HealthCheck as _HealthCheck4
except ImportError:  # not installed, or 3.x
    _HealthCheck4 = None

try:  # django-health-check 3.x: backends registered with plugin_dir
    from health_check.backends import BaseHealthCheckBackend as _Backend3
except ImportError:
    _Backend3 = None


def _unhealthy_message(report: HealthReport) -> str:
    return "; ".join(report.problems) or "unhealthy"


if _HealthCheck4 is not None:
    from asgiref.sync import sync_to_async
    from health_check.exceptions import ServiceUnavailable

    @dataclasses.dataclass
    class ZeroLossHealthCheck(_HealthCheck4):
        """``HealthCheckView.as_view(checks=[..., "zeroloss.health.ZeroLossHealthCheck"])``."""

        alias: str = DEFAULT_DB_ALIAS

        async def run(self) -> None:
            # The request's own thread and connection, never a fresh one per executor thread.
            report = await sync_to_async(self._report, thread_sensitive=True)()
            if not report.healthy:
                raise ServiceUnavailable(_unhealthy_message(report))

        def _report(self) -> HealthReport:
            return health_report(ZeroLossMessageService(using=self.alias))


if _Backend3 is not None:
    from health_check.exceptions import ServiceUnavailable as _Unavailable3

    class ZeroLossHealthCheckBackend(_Backend3):
        """For django-health-check 3.x: ``plugin_dir.register(ZeroLossHealthCheckBackend)``."""

        critical_service = True

        def check_status(self, subset: Any = None) -> None:
            report = health_report()
            if not report.healthy:
                self.add_error(_Unavailable3(_unhealthy_message(report)))

        def identifier(self) -> str:
            return "zeroloss"
