"""The JSON health view, the snapshot cache behind it, and the snapshot API."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import override_settings
from django.urls import reverse

import zeroloss.ops.health
from tests.support import backdate
from tests.support.factories import clear_cache, make_completed, make_dead, make_stuck
from tests.support.waiting import wait_until
from zeroloss.exceptions import InvalidMessage
from zeroloss.ledger import partitions
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ops.health import commit_stall
from zeroloss.ops.snapshot import Snapshot, cache_key, compute_snapshot, get_snapshot, invalidate

pytestmark = pytest.mark.django_db

HEALTH_KEYS = {"status", "checks", "problems", "warnings", "taken_at", "cached"}


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def health(client) -> tuple[int, dict]:
    response = client.get("/zeroloss/health/")
    assert response["Content-Type"] == "application/json"
    assert "no-cache" in response["Cache-Control"]
    data = response.json()
    assert set(data) == HEALTH_KEYS
    return response.status_code, data


def test_url_is_routed():
    assert reverse("zeroloss:health") == "/zeroloss/health/"


def test_healthy(client):
    make_completed(["c1"])
    code, data = health(client)
    assert code == 200
    assert data["status"] == "ok"
    assert data["problems"] == []
    assert data["checks"]["stuck"] == {"ok": True, "value": 0, "max": 0}
    assert data["checks"]["dead"] == {"ok": True, "value": 0, "max": 100}
    assert data["checks"]["replication"] == {
        "ok": True,
        "required": 0,
        "available": 0,
        "problems": [],
    }
    assert data["checks"]["database"] == {"ok": True}
    assert data["checks"]["storage"] == {"ok": True, "error": None}


@pytest.mark.process
def test_a_full_disk_that_refuses_new_sessions_is_reported_as_a_storage_fault():
    """A full data disk makes PostgreSQL refuse new sessions ("FATAL: could not write init
    file"): the health check cannot read the ledger, and says it is the storage (the fault
    suite fills a disk for real, tests/faults/storage.py)."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT, child_env
    from tests.infra.pgcluster import free_port

    script = (
        "from django.db import OperationalError\n"
        "from zeroloss.ops.health import health_report\n"
        "from zeroloss.core.outage import OutageMonitor\n"
        "from zeroloss.ledger.service import ZeroLossMessageService\n"
        "import json\n"
        "OutageMonitor.for_alias('down').failed('a send', OperationalError("
        "'connection failed: FATAL: could not write init file'))\n"
        "print(json.dumps(health_report(ZeroLossMessageService(using='down'), use_cache=False).as_dict()))\n"
    )
    env = child_env(
        ZEROLOSS_EXTRA_DATABASES=json.dumps({"down": f"postgres://postgres@127.0.0.1:{free_port()}/nothing"})
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["status"] == "fail"
    assert report["checks"]["database"]["ok"] is False
    assert report["checks"]["storage"]["ok"] is False
    assert report["problems"][0].startswith("database storage fault since ")


def test_stuck_above_threshold_fails(client, settings):
    make_stuck(["s1", "s2"])
    code, data = health(client)
    assert code == 503
    assert data["status"] == "fail"
    assert data["checks"]["stuck"] == {"ok": False, "value": 2, "max": 0}
    assert data["problems"] == ["2 stuck message(s) (expired leases), above HEALTH_MAX_STUCK=0"]
    settings.ZEROLOSS = {**settings.ZEROLOSS, "HEALTH_MAX_STUCK": 2}
    clear_cache()
    assert health(client)[0] == 200


def test_dead_above_threshold_fails(client, settings):
    make_dead(["d1", "d2"])
    assert health(client)[0] == 200
    settings.ZEROLOSS = {**settings.ZEROLOSS, "HEALTH_MAX_DEAD": 1}
    clear_cache()
    code, data = health(client)
    assert code == 503
    assert data["checks"]["dead"] == {"ok": False, "value": 2, "max": 1}


def test_unmet_replication_requirement_fails(client, settings):
    settings.ZEROLOSS = {**settings.ZEROLOSS, "REPLICATION_FACTOR": 2}
    code, data = health(client)
    assert code == 503
    assert data["checks"]["replication"]["ok"] is False
    assert data["checks"]["replication"]["required"] == 1
    assert data["problems"]  # says why, in words


def test_an_unknown_database_alias_is_refused_when_the_service_is_built():
    # A typo in the alias is a configuration error, said at once, not a health probe's "down".
    with pytest.raises(InvalidMessage, match="Unknown database alias 'missing'; DATABASES has default"):
        ZeroLossMessageService(using="missing")


@pytest.mark.process
def test_an_unreachable_database_says_since_when_and_logs_once():
    """Each probe answers "unreachable since <time>" at once; the log gets one line per outage."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT, child_env
    from tests.infra.pgcluster import free_port

    script = (
        "from zeroloss.ops.health import health_report\n"
        "from zeroloss.ledger.service import ZeroLossMessageService\n"
        "import json\n"
        "reports = [health_report(ZeroLossMessageService(using='down'), use_cache=False) for _ in range(3)]\n"
        "print(json.dumps([r.as_dict() for r in reports]))\n"
    )
    env = child_env(
        ZEROLOSS_EXTRA_DATABASES=json.dumps({"down": f"postgres://postgres@127.0.0.1:{free_port()}/nothing"}),
        ZEROLOSS_LOG_LEVEL="INFO",
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(r["status"] == "fail" for r in reports)
    assert all(r["problems"][0].startswith("database unreachable since ") for r in reports)
    assert (
        reports[0]["checks"]["database"]["unreachable_since"]
        == reports[2]["checks"]["database"]["unreachable_since"]
    )
    assert done.stderr.count("unreachable since") == 1 and "Traceback" not in done.stderr


def test_health_is_cached_for_cache_timeout(client):
    assert health(client)[0] == 200
    make_stuck(["s1"])
    code, data = health(client)
    assert (code, data["cached"]) == (200, True)  # a few seconds stale, by design
    invalidate(ZeroLossMessageService())
    assert health(client)[0] == 503


def test_only_safe_methods(client):
    assert client.post("/zeroloss/health/").status_code == 405


class TestSnapshot:
    def test_round_trips_through_the_cache(self):
        make_stuck(["s1"], queue="a")
        make_dead(["d1"], queue="b")
        service = ZeroLossMessageService()
        fresh = get_snapshot(service)
        assert fresh.cached is False
        cached = get_snapshot(service)
        assert cached.cached is True
        assert cached.as_dict() | {"cached": False} == fresh.as_dict()
        assert isinstance(cached, Snapshot)
        assert (cached.stuck, cached.dead, cached.total) == (1, 1, 2)
        assert cached.queues["a"].stuck == 1
        assert cached.for_queue("b").total == 1
        assert cached.for_queue("zzz").queues == {}

    def test_use_cache_false_reads_and_refreshes(self):
        service = ZeroLossMessageService()
        assert get_snapshot(service).total == 0
        service.persist_message("m", "q", {})
        assert get_snapshot(service).total == 0
        assert get_snapshot(service, use_cache=False).total == 1
        assert get_snapshot(service).total == 1  # the fresh read refreshed the cache

    def test_cache_key_follows_the_settings_that_change_the_answer(self):
        assert cache_key(ZeroLossMessageService()) != cache_key(ZeroLossMessageService(replication_factor=2))
        assert cache_key(ZeroLossMessageService()) == cache_key(ZeroLossMessageService(ack_timeout=9))

    def test_cache_timeout_zero_disables_caching(self, settings):
        settings.ZEROLOSS = {**settings.ZEROLOSS, "CACHE_TIMEOUT": 0}
        service = ZeroLossMessageService()
        get_snapshot(service)
        service.persist_message("m", "q", {})
        assert get_snapshot(service).total == 1

    @override_settings(
        CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/0"}}
    )
    def test_a_broken_cache_never_breaks_a_read(self):
        # Nothing listens on port 1: every cache call fails; the snapshot still comes back.
        service = ZeroLossMessageService()
        service.persist_message("m", "q", {})
        assert get_snapshot(service).total == 1
        assert get_snapshot(service).cached is False
        invalidate(service)

    def test_oldest_pending_age_ignores_messages_not_yet_due(self):
        service = ZeroLossMessageService()
        service.persist_message("later", "q", {}, delay=3600)
        snap = compute_snapshot(service)
        assert snap.queues["q"].oldest_pending_age == 0.0
        service.persist_message("now", "r", {})
        backdate(["now"], "available_at", seconds_ago=1)
        snap = compute_snapshot(service)
        assert snap.queues["r"].oldest_pending_age is not None
        assert snap.queues["r"].oldest_pending_age >= 0.2
        assert snap.oldest_pending_age == snap.queues["r"].oldest_pending_age


def test_healthy_shows_the_partitions_covered(client):
    code, data = health(client)
    assert code == 200
    check = data["checks"]["partitions"]
    if connection.vendor == "sqlite":
        assert check == {"ok": True, "partitioned": False, "covered_until": None, "running_out": False}
        return
    assert check["ok"] and check["partitioned"]
    covered = partitions.coverage(connection)
    assert covered is not None and check["covered_until"] == covered.isoformat()


@pytest.mark.postgres_only
def test_a_partitioned_ledger_without_partitions_ahead_fails(client):
    """The partitions after today's dropped (inside the test's transaction, rolled back): sends
    would have nowhere to go at midnight, less than a PARTITION_PERIOD away."""
    today = next(
        p for p in partitions.partitions(connection) if p.start <= partitions.database_now(connection) < p.end
    )
    with connection.cursor() as cursor:
        for p in partitions.partitions(connection):
            if p.start >= today.end:
                cursor.execute(f"DROP TABLE {p.name}, {p.name.replace('message', 'messageevent', 1)}")
    code, data = health(client)
    assert code == 503
    assert data["checks"]["partitions"] == {
        "ok": False,
        "partitioned": True,
        "covered_until": today.end.isoformat(),
        "running_out": True,
    }
    assert data["problems"] == [
        f"sends have a partition only until {today.end.isoformat()}, less than PARTITION_PERIOD ahead: "
        "is a sweep running? (zeroloss_partition show)"
    ]


@pytest.mark.postgres_only
def test_a_commit_slower_than_the_deadline_is_reported_as_a_stall():
    """The stall probe commits a transaction id in a thread of its own and waits at most the
    deadline: a commit that is not done by then is reported (the real stall: the fault suite's
    FUSE filesystem, tests/faults/stallfs.py)."""
    assert commit_stall("default") == ""  # a healthy disk commits within 2 s
    stalled = commit_stall("default", deadline=0.0)  # no commit is done in 0 s
    assert stalled.startswith("a commit has taken > 0 s (")
    assert wait_until(lambda: not zeroloss.ops.health._stall_probes, 10)  # it finishes, and is forgotten
