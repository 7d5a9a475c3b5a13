"""Prometheus metrics, scraped through the real URL and parsed with the Prometheus text parser."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db.models.functions import Now
from django.urls import reverse
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import expire_leases
from tests.support.factories import clear_cache, make_completed, make_dead, make_leased, make_stuck
from zeroloss.integrations.telemetry.prometheus import NAMES
from zeroloss.ledger.models import ReplicationNode
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ops import metrics

pytestmark = pytest.mark.django_db


EVENT_METRICS = set(NAMES)


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def scrape(client, **headers) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/zeroloss/metrics/", **headers)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    assert "no-cache" in response["Cache-Control"]
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        if family.name in EVENT_METRICS:
            continue  # the event counters and histograms (tests/ledger/test_telemetry*.py)
        assert family.type == "gauge"
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def seed() -> None:
    ZeroLossMessageService().persist_messages([(f"p{i}", "emails", {"i": i}) for i in range(3)])
    make_stuck(["s1", "s2"], queue="emails")
    make_leased(["l1"], queue="emails")
    make_dead(["d1"], queue="sms")
    make_completed(["c1", "c2"], queue="sms")


def test_url_is_routed():
    assert reverse("zeroloss:metrics") == "/zeroloss/metrics/"


def test_scrape_reports_the_ledger(client):
    seed()
    ZeroLossMessageService(instance_id="sweeper").sweep()
    m = scrape(client)
    assert m[("zeroloss_up", ())] == 1
    expected = {
        ("emails", "pending"): 5,  # 3 new + 2 requeued by the sweep
        ("emails", "processing"): 1,
        ("emails", "completed"): 0,
        ("emails", "dead"): 0,
        ("sms", "pending"): 0,
        ("sms", "processing"): 0,
        ("sms", "completed"): 2,
        ("sms", "dead"): 1,
    }
    for (queue, status), value in expected.items():
        assert m[("zeroloss_messages", (("queue", queue), ("status", status)))] == value
    assert m[("zeroloss_dead_letters", (("queue", "sms"),))] == 1
    assert m[("zeroloss_dead_letters", (("queue", "emails"),))] == 0
    assert m[("zeroloss_expired_leases", (("queue", "emails"),))] == 0
    assert m[("zeroloss_oldest_pending_age_seconds", (("queue", "emails"),))] > 0
    assert m[("zeroloss_oldest_pending_age_seconds", (("queue", "sms"),))] == 0
    assert m[("zeroloss_sweep_runs", ())] == 1
    assert m[("zeroloss_sweep_recovered_messages", (("outcome", "requeued"),))] == 2
    assert m[("zeroloss_sweep_recovered_messages", (("outcome", "dead_lettered"),))] == 0
    assert m[("zeroloss_nodes", (("state", "live"),))] == 0
    assert m[("zeroloss_nodes", (("state", "down"),))] == 0
    assert m[("zeroloss_replication_required_standbys", ())] == 0
    assert m[("zeroloss_replication_ok", ())] == 1
    assert m[("zeroloss_snapshot_timestamp_seconds", ())] > 1.7e9


def test_expired_leases_and_sweep_dead_letters(client):
    worker = ZeroLossMessageService(max_attempts=1, instance_id="w")
    worker.persist_messages([("x1", "q", {}), ("x2", "q", {}), ("x3", "q", {})])
    for mid in ("x1", "x2", "x3"):
        assert worker.claim_message(mid)
    assert expire_leases(["x1", "x2", "x3"]) == 3
    m = scrape(client)
    assert m[("zeroloss_expired_leases", (("queue", "q"),))] == 3
    clear_cache()
    ZeroLossMessageService(instance_id="sweeper").sweep()
    m = scrape(client)
    assert m[("zeroloss_expired_leases", (("queue", "q"),))] == 0
    assert m[("zeroloss_dead_letters", (("queue", "q"),))] == 3
    assert m[("zeroloss_sweep_recovered_messages", (("outcome", "dead_lettered"),))] == 3
    assert m[("zeroloss_sweep_runs", ())] == 1


def test_nodes_live_and_down(client, settings):
    svc = ZeroLossMessageService()
    svc.register_replication_node("n1")
    svc.register_replication_node("n2")
    ttl = ZeroLossMessageService().settings.NODE_TTL
    # Both last seen two TTLs ago by the database's clock; n1 then beats again.
    ReplicationNode.objects.update(last_seen_at=Now() - dt.timedelta(seconds=2 * ttl))
    ZeroLossMessageService().heartbeat_node("n1")
    m = scrape(client)
    assert m[("zeroloss_nodes", (("state", "live"),))] == 1
    assert m[("zeroloss_nodes", (("state", "down"),))] == 1


def test_replication_requirement_unmet(client, settings):
    settings.ZEROLOSS = {**settings.ZEROLOSS, "REPLICATION_FACTOR": 2}
    m = scrape(client)
    assert m[("zeroloss_replication_required_standbys", ())] == 1
    assert m[("zeroloss_replication_available_standbys", ())] == 0
    assert m[("zeroloss_replication_ok", ())] == 0


def test_scrapes_are_cached_for_cache_timeout(client, settings):
    seed()
    first = scrape(client)
    ZeroLossMessageService().persist_message("late", "emails", {})
    cached = scrape(client)
    assert cached == first  # same snapshot, same timestamp
    clear_cache()
    fresh = scrape(client)
    pending = ("zeroloss_messages", (("queue", "emails"), ("status", "pending")))
    assert fresh[pending] == first[pending] + 1
    settings.ZEROLOSS = {**settings.ZEROLOSS, "CACHE_TIMEOUT": 0}
    ZeroLossMessageService().persist_message("later", "emails", {})
    assert scrape(client)[pending] == first[pending] + 2


def test_openmetrics_on_request(client):
    seed()
    response = client.get("/zeroloss/metrics/", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.decode().rstrip().endswith("# EOF")


def test_only_safe_methods(client):
    assert client.post("/zeroloss/metrics/").status_code == 405
    assert client.head("/zeroloss/metrics/").status_code == 200


def test_unreadable_database_reports_up_zero():
    registry = CollectorRegistry()
    registry.register(metrics.ZeroLossCollector("no-such-alias", use_cache=False))
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    assert [(f.name, [s.value for s in f.samples]) for f in families] == [("zeroloss_up", [0.0])]


def test_register_default_is_idempotent_and_serves_the_default_registry():
    seed()
    try:
        first = metrics.register_default()
        assert metrics.register_default() is first
        text = generate_latest(REGISTRY).decode()
        names = {f.name for f in text_string_to_metric_families(text)}
        assert {"zeroloss_messages", "zeroloss_dead_letters", "zeroloss_up"} <= names
        assert "python_info" in names  # the default registry's own collectors are still there
    finally:
        metrics.unregister_default()
    assert "zeroloss_messages" not in generate_latest(REGISTRY).decode()


def test_describe_never_touches_the_database(django_assert_num_queries):
    with django_assert_num_queries(0):
        registry = CollectorRegistry()
        registry.register(metrics.ZeroLossCollector())
