"""URLs a project can include: ``path("zeroloss/", include("zeroloss.urls"))``.

- ``metrics/``: Prometheus exposition of the ledger (needs ``zeroloss[metrics]``; answers
  501 with an explanation when ``prometheus-client`` is missing);
- ``health/``: JSON health with the alerts (stuck and dead counts, replication, the database),
  HTTP 200 or 503: for monitors;
- ``health/live/`` and ``health/ready/``: liveness (the process answers) and readiness (its
  ledger databases answer), HTTP 200 or 503: for load balancers and Kubernetes probes.

Both are unauthenticated, like most scrape and probe endpoints: restrict them at the proxy
or network level if queue names are sensitive.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, URLResolver, path

from .ops.health import health_view, live_view, ready_view

app_name = "zeroloss"

try:
    from .ops.metrics import metrics_view, register_default
except ImportError as exc:  # prometheus-client is an optional dependency
    _missing = str(exc)

    def metrics_view(request: HttpRequest) -> HttpResponse:
        return HttpResponse(
            f'Metrics need prometheus-client: pip install "zeroloss[metrics]" ({_missing}).\n',
            status=501,
            content_type="text/plain; charset=utf-8",
        )

else:
    if "django_prometheus" in settings.INSTALLED_APPS:
        # Its /metrics exports prometheus_client.REGISTRY: the ledger's metrics join it.
        register_default()

urlpatterns: list[URLPattern | URLResolver] = [
    path("metrics/", metrics_view, name="metrics"),
    path("health/", health_view, name="health"),
    path("health/live/", live_view, name="health-live"),
    path("health/ready/", ready_view, name="health-ready"),
]
