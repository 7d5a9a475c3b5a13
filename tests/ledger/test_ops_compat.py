"""Optional integrations: django-health-check (4.x API) and django-prometheus.

Both packages are dev dependencies of the test suite (pyproject's ``dev`` extra), not of
zeroloss itself.
"""

from __future__ import annotations

import importlib

import pytest
from django.test import RequestFactory, override_settings
from django.urls import path
from django_prometheus.exports import ExportToDjangoView
from health_check.views import HealthCheckView
from prometheus_client.parser import text_string_to_metric_families

import zeroloss.urls
from tests.support.factories import clear_cache, make_dead, make_stuck
from zeroloss.health import ZeroLossHealthCheck
from zeroloss.ops import metrics

pytestmark = pytest.mark.django_db

urlpatterns = [
    path(
        "ht/",
        HealthCheckView.as_view(
            checks=["health_check.checks.Database", "zeroloss.health.ZeroLossHealthCheck"]
        ),
    ),
]


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


class TestDjangoHealthCheck:
    @pytest.fixture(autouse=True)
    def _urls(self, settings):
        settings.ROOT_URLCONF = __name__

    def test_healthy(self, client):
        make_dead(["d1"])
        response = client.get("/ht/?format=json")
        assert response.status_code == 200
        assert response.json() == {
            "Database(alias='default')": "OK",
            "ZeroLossHealthCheck(alias='default')": "OK",
        }

    def test_stuck_messages_fail_the_check(self, client):
        make_stuck(["s1"])
        response = client.get("/ht/?format=json")
        assert response.status_code == 500
        body = response.json()
        assert body["Database(alias='default')"] == "OK"
        assert body["ZeroLossHealthCheck(alias='default')"] == (
            "Unavailable: 1 stuck message(s) (expired leases), above HEALTH_MAX_STUCK=0"
        )

    def test_replication_requirement_fails_the_check(self, client, settings):
        settings.ZEROLOSS = {**settings.ZEROLOSS, "REPLICATION_FACTOR": 2}
        response = client.get("/ht/?format=json")
        assert response.status_code == 500
        assert response.json()["ZeroLossHealthCheck(alias='default')"].startswith("Unavailable: ")

    def test_check_is_a_dataclass_with_an_alias(self):
        assert ZeroLossHealthCheck().labels == {"check": "ZeroLossHealthCheck", "alias": "default"}


class TestDjangoPrometheus:
    def test_default_registry_export_includes_the_ledger(self):
        make_dead(["d1"], queue="sms")
        try:
            metrics.register_default()
            response = ExportToDjangoView(RequestFactory().get("/metrics"))
        finally:
            metrics.unregister_default()
        assert response.status_code == 200
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(response.content.decode())
            for s in f.samples
        }
        assert samples[("zeroloss_dead_letters", (("queue", "sms"),))] == 1
        assert samples[("zeroloss_messages", (("queue", "sms"), ("status", "dead")))] == 1

    def test_urls_register_the_collector_when_django_prometheus_is_installed(self, settings):
        try:
            with override_settings(INSTALLED_APPS=[*settings.INSTALLED_APPS, "django_prometheus"]):
                importlib.reload(zeroloss.urls)
            assert metrics._default_collector is not None
        finally:
            metrics.unregister_default()
            importlib.reload(zeroloss.urls)
        assert metrics._default_collector is None
