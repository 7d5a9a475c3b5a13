"""Small things users trip on (issue 25, point 10): retry backoff with full jitter (one incident's
failures do not retry in lockstep), liveness and readiness apart from the alerts, ``--no-input``
as Django spells it, human-readable durations, and every option's help with its default. Real
databases; one real process for an unreachable database."""

from __future__ import annotations

import io
import json
import random
import statistics
import subprocess
import sys

import pytest
from django.core.checks import Error
from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.support.factories import clear_cache, make_completed, make_dead
from zeroloss.conf import RetryBackoff
from zeroloss.ledger.models import Message
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ledger.types import Completion, Verdict
from zeroloss.management.base import DefaultsHelpFormatter
from zeroloss.ops import checks

pytestmark = pytest.mark.django_db(transaction=True)


# -- retry backoff: full jitter -----------------------------------------------------------


def test_full_jitter_draws_each_delay_from_zero_to_the_exponential_bound():
    backoff = RetryBackoff(BASE=10, MAX=300)
    rng = random.Random(25)
    for attempt, bound in ((1, 10), (3, 40), (6, 300), (60, 300)):
        delays = [backoff.delay_for(attempt, rng) for _ in range(2000)]
        assert backoff.bound_for(attempt) == bound
        assert all(0 <= d <= bound for d in delays)
        # Uniform over [0, bound]: spread over the whole range, not bunched at the bound.
        assert min(delays) < bound * 0.01 and max(delays) > bound * 0.99
        assert abs(statistics.mean(delays) - bound / 2) < bound * 0.05
        assert len(set(delays)) == len(delays)
    exact = RetryBackoff(BASE=10, MAX=300, JITTER=False)
    assert [exact.delay_for(n) for n in (1, 3, 6)] == [10, 40, 300]


@pytest.mark.parametrize("jitter", [True, False])
def test_a_retry_backoff_override_keeps_its_jitter(jitter):
    service = ZeroLossMessageService(retry_backoff=RetryBackoff(BASE=5, MAX=60, JITTER=jitter))
    assert RetryBackoff(BASE=5, MAX=60, JITTER=jitter) == service.settings.RETRY_BACKOFF


@pytest.mark.parametrize("jitter", [True, False])
def test_one_incidents_failures_do_not_retry_in_lockstep(jitter):
    service = ZeroLossMessageService(retry_backoff={"BASE": 100, "MAX": 100, "JITTER": jitter})
    ids = [f"m{i}" for i in range(50)]
    service.persist_messages([(mid, "q", {}) for mid in ids])
    leases = service.claim("q", limit=50)
    report = service.record_outcomes(
        [Completion(lease, Verdict.FAIL, error="the same outage") for lease in leases]
    )
    assert sorted(report.retrying) == sorted(ids)
    rows = Message.objects.filter(message_id__in=ids).values_list("available_at", "updated_at")
    delays = [(available - updated).total_seconds() for available, updated in rows if available is not None]
    assert len(delays) == 50
    assert all(-0.001 <= d <= 100.001 for d in delays)
    if jitter:  # spread over the window: 50 uniform draws in 100 s
        assert len({round(d, 3) for d in delays}) > 40 and max(delays) - min(delays) > 50
    else:
        assert {round(d) for d in delays} == {100}


def test_jitter_must_be_a_bool(settings):
    settings.ZEROLOSS = {"RETRY_BACKOFF": {"JITTER": "yes"}}
    assert checks.check_settings() == [
        Error(
            "ZEROLOSS['RETRY_BACKOFF.JITTER']: must be True or False, got 'yes'.",
            hint="must be True or False, got 'yes'.",
            obj="settings.ZEROLOSS",
            id="zeroloss.E003",
        )
    ]


# -- health: liveness, readiness, alerts ------------------------------------------------------


def test_liveness_answers_without_a_query(client):
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/zeroloss/health/live/")
    assert (response.status_code, response.json(), len(queries)) == (200, {"status": "ok"}, 0)
    assert "no-cache" in response["Cache-Control"]


def test_readiness_ignores_the_alerts_that_health_reports(client, settings):
    clear_cache()
    settings.ZEROLOSS = {"HEALTH_MAX_DEAD": 0}
    make_dead(["d1"])
    make_completed(["c1"])
    assert client.get("/zeroloss/health/").status_code == 503  # an alert: a dead letter
    ready = client.get("/zeroloss/health/ready/")
    assert (ready.status_code, ready.json()) == (
        200,
        {"status": "ok", "databases": {"default": {"ok": True}}},
    )
    assert client.get("/zeroloss/health/live/").status_code == 200
    assert client.post("/zeroloss/health/ready/").status_code == 405


@pytest.mark.process
def test_readiness_fails_when_a_ledger_database_is_unreachable():
    from tests.conftest import ROOT, child_env
    from tests.infra.pgcluster import free_port

    script = (
        "from django.test import RequestFactory\n"
        "from zeroloss.ops.health import ready_view\n"
        "r = ready_view(RequestFactory().get('/zeroloss/health/ready/'))\n"
        "print(r.status_code, r.content.decode())\n"
    )
    env = child_env(
        ZEROLOSS_EXTRA_DATABASES=json.dumps({"down": f"postgres://postgres@127.0.0.1:{free_port()}/nothing"}),
        ZEROLOSS_SETTINGS_JSON=json.dumps({"LEDGER_DATABASES": ["default", "down"]}),
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
    code, body = done.stdout.strip().splitlines()[-1].split(" ", 1)
    assert code == "503"
    assert json.loads(body) == {
        "status": "fail",
        "databases": {"default": {"ok": True}, "down": {"ok": False, "error": "OperationalError"}},
    }


# -- confirmation: --no-input / --noinput -----------------------------------------------------


def purge(*args: str, **options) -> str:
    out = io.StringIO()
    call_command("zeroloss_purge", "--older-than", "0s", *args, stdout=out, stdin=io.StringIO(), **options)
    return out.getvalue()


def test_no_input_is_yes_as_djangos_commands_spell_it():
    make_completed(["c1", "c2", "c3", "c4"])
    with pytest.raises(CommandError, match="Refusing without --yes") as refused:  # no terminal, no flag
        purge()
    assert refused.value.returncode == 3 and Message.objects.count() == 4
    assert "purged 1 completed" in purge("--no-input", "--limit", "1")
    assert "purged 1 completed" in purge("--noinput", "--limit", "1")
    assert "purged 1 completed" in purge("--yes", "--limit", "1")
    assert "purged 1 completed" in purge(interactive=False)  # call_command, as Django's flush takes it
    assert Message.objects.count() == 0


def test_requeue_takes_no_input_too():
    make_dead(["d1"])
    with pytest.raises(CommandError, match="Refusing without --yes"):
        call_command("zeroloss_requeue", "--queue", "q", "--state", "dead", stdin=io.StringIO())
    call_command("zeroloss_requeue", "--queue", "q", "--state", "dead", "--noinput", stdout=io.StringIO())
    assert Message.objects.get(message_id="d1").status == "pending"


# -- durations and help -------------------------------------------------------------------------


def test_durations_are_printed_human_readable():
    make_completed(["c1"])
    assert "older than 2h 00m (before " in purge("--older-than", "2h", "--yes")
    out = io.StringIO()
    call_command("zeroloss_sweep", "--loop", "--max-runs", "1", "--interval", "90", stdout=out, stderr=out)
    assert "sweeping every 1m 30s" in out.getvalue()


ZEROLOSS_COMMANDS = sorted(name for name, app in get_commands().items() if app == "zeroloss")
#: Django's own options whose None default means "from the environment".
FROM_ENVIRONMENT = {"settings", "pythonpath", "help", "version"}


@pytest.mark.parametrize("name", ZEROLOSS_COMMANDS)
def test_every_options_help_shows_its_default(name):
    parser = load_command_class("zeroloss", name).create_parser("manage.py", name)
    formatter = parser._get_formatter()
    assert isinstance(formatter, DefaultsHelpFormatter)
    missing = [
        action.option_strings[0]
        for action in parser._actions
        if action.option_strings and action.dest not in FROM_ENVIRONMENT
        for text in [formatter._get_help_string(action) or ""]
        if "default" not in text and "(required)" not in text
    ]
    assert not missing, f"{name}: {missing}"
    assert "(default: 1)" in parser.format_help()  # --verbosity, expanded


def test_a_help_default_is_the_real_value():
    text = (
        load_command_class("zeroloss", "zeroloss_worker")
        .create_parser("manage.py", "zeroloss_worker")
        .format_help()
    )
    assert "Seconds to wait when idle. (default: 0.5)" in " ".join(text.split())
    assert "Exit once the queues are empty. (default: off)" in " ".join(text.split())
