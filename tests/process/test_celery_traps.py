"""No silent Celery trap: a send that would publish through an app other than the project's is
refused before anything is stored, and ``manage.py check`` says so (``zeroloss.E070``); beat with
the documented entry runs the schedules too; a schedule no scheduler sends is reported by
``zeroloss_status``, the health endpoint and the admin.

The first trap is shown as a new project meets it: a ``proj`` package written to a temporary
directory whose ``__init__.py`` lacks the import, run by a fresh interpreter. The schedules run
under a real Celery worker and beat over the real Redis broker.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import Client
from django.urls import reverse

import zeroloss
from tests.support.celery import REDIS_URL
from tests.support.cli import run
from tests.support.processes import celery_beat, celery_worker
from tests.support.waiting import wait_until
from zeroloss.exceptions import CeleryAppNotConfigured
from zeroloss.integrations.celery import app as celery_app
from zeroloss.integrations.celery.beat import beat_schedule_entry
from zeroloss.ledger.models import Message, Status
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ops.health import health_report
from zeroloss.runtime.schedules.models import ScheduleState
from zeroloss.runtime.schedules.overdue import overdue_schedules
from zeroloss.runtime.schedules.scheduler import Scheduler

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]


# -- which app publishes -------------------------------------------------------------------------


@pytest.fixture
def celerys_own_app() -> Iterator[Any]:
    """This thread sees what a process that never imported ``proj.celery`` sees: Celery's fallback."""
    from celery import _state

    state: Any = _state
    saved = (state._tls.current_app, state.default_app)
    state._tls.current_app, state.default_app = None, None
    try:
        yield state.get_current_app()  # Celery creates its fallback, exactly as current_app would
    finally:
        state._tls.current_app, state.default_app = saved


def test_send_through_celerys_default_app_is_refused_before_anything_is_stored(settings, celerys_own_app):
    assert celerys_own_app.main == "default"
    settings.ZEROLOSS = {**settings.ZEROLOSS, "TRANSPORT": "celery"}
    with pytest.raises(CeleryAppNotConfigured) as refused:
        zeroloss.send("demo.record", {"n": 1})
    text = str(refused.value)
    assert "Celery's own default app (amqp://guest@localhost//)" in text
    assert "from .celery import app as celery_app" in text and text.endswith("Nothing was stored.")
    with pytest.raises(CeleryAppNotConfigured):
        zeroloss.send_many("demo.record", [{"n": 2}])
    assert Message.objects.count() == 0
    with pytest.raises(SystemCheckError, match=r"zeroloss\.E070") as failed:
        call_command("check")
    assert "HINT: proj/__init__.py: from .celery import app as celery_app" in str(failed.value)
    settings.ZEROLOSS = {**settings.ZEROLOSS, "TRANSPORT": "database"}
    assert celery_app.check_celery_app() == []  # the built-in worker publishes nothing
    zeroloss.send("demo.record", {"n": 3})


def test_an_app_whose_broker_is_not_celery_broker_url_is_refused(settings):
    settings.ZEROLOSS = {**settings.ZEROLOSS, "TRANSPORT": "celery"}
    settings.CELERY_BROKER_URL = "redis://:s3cret@127.0.0.1:6379/4"
    from celery import _state

    state: Any = _state
    saved = state._tls.current_app
    stray = Celery("proj", broker="amqp://guest@localhost//")  # current in this thread from now on
    try:
        with pytest.raises(CeleryAppNotConfigured) as refused:
            zeroloss.send("demo.record", {"n": 1})
        text = str(refused.value)
        assert "'proj' publishes to amqp://guest@localhost//" in text
        assert "not to CELERY_BROKER_URL (redis://:**@127.0.0.1:6379/4)" in text and "s3cret" not in text
        assert "app.config_from_object('django.conf:settings', namespace='CELERY')" in text
        assert Message.objects.count() == 0
        [error] = celery_app.check_celery_app()
        assert error.id == "zeroloss.E070"
        stray.conf["broker_url"] = settings.CELERY_BROKER_URL  # the same broker: accepted
        assert celery_app.check_celery_app() == []
    finally:
        state._tls.current_app = saved


def test_the_projects_own_app_passes(settings, broker):
    assert celery_app.project_app().main == "project"
    assert celery_app.check_celery_app() == []
    zeroloss.send("demo.record", {"n": 1})
    assert broker.llen("celery") == 1  # published on the configured Redis


# -- the trap as a new project meets it ---------------------------------------------------------

PROJ_SETTINGS = """
    SECRET_KEY = "trap"
    INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "zeroloss"]
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": __DB__}}
    USE_TZ = True
    CELERY_BROKER_URL = __BROKER__
    ZEROLOSS = {"TRANSPORT": "celery", "QUEUES": {"emails": {}}}
"""

PROJ_CELERY = """
    import os

    from celery import Celery

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "proj.settings")
    app = Celery("proj")
    app.config_from_object("django.conf:settings", namespace="CELERY")
"""

SEND = """
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import zeroloss
    from zeroloss.ledger.models import Message

    try:
        zeroloss.send("emails", {"to": "a@example.com"})
        print("sent")
    except Exception as exc:
        print(type(exc).__name__, exc)
    print("stored", Message.objects.count())
"""


def write_project(where: Path, *, with_import: bool) -> None:
    package = where / "proj"
    package.mkdir(exist_ok=True)
    settings_text = textwrap.dedent(PROJ_SETTINGS).replace("__DB__", repr(str(where / "db.sqlite3")))
    (package / "settings.py").write_text(settings_text.replace("__BROKER__", repr(REDIS_URL)))
    (package / "celery.py").write_text(textwrap.dedent(PROJ_CELERY))
    (package / "__init__.py").write_text(celery_app.INIT_IMPORT + "\n" if with_import else "")
    (where / "send.py").write_text(textwrap.dedent(SEND))


def python(where: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CELERY_", "ZEROLOSS_"))}
    env.update(DJANGO_SETTINGS_MODULE="proj.settings", PYTHONPATH=f"{where}{os.pathsep}{ROOT}")
    return subprocess.run(
        [sys.executable, *args], cwd=where, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_a_new_project_without_the_init_import_is_told_before_anything_is_sent(tmp_path, broker):
    write_project(tmp_path, with_import=False)
    check = python(tmp_path, "-m", "django", "check")
    assert check.returncode == 1, check.stdout + check.stderr
    assert "zeroloss.E070" in check.stderr and "proj/__init__.py: from .celery import app as celery_app" in (
        check.stderr
    )
    sent = python(tmp_path, "send.py")
    assert sent.returncode == 0, sent.stderr
    assert (
        "CeleryAppNotConfigured ZEROLOSS['TRANSPORT'] is 'celery', but the project's Celery app"
        in sent.stdout
    )
    assert "stored 0" in sent.stdout and broker.llen("celery") == 0

    write_project(tmp_path, with_import=True)  # the fix the message gives
    check = python(tmp_path, "-m", "django", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    sent = python(tmp_path, "send.py")
    assert sent.stdout.split("\n")[:2] == ["sent", "stored 1"], sent.stdout + sent.stderr
    assert broker.llen("celery") == 1  # on the broker the settings name


# -- schedules under beat ----------------------------------------------------------------------


def test_the_sweeps_beat_entry_brings_the_schedulers():
    assert beat_schedule_entry(interval=10) == {
        "zeroloss-sweep": {"task": "zeroloss.sweep", "schedule": 10, "options": {"queue": "zeroloss.sweep"}},
        "zeroloss-schedule": {
            "task": "zeroloss.schedule",
            "schedule": 1.0,
            "options": {"queue": "zeroloss.sweep"},
        },
    }
    assert list(beat_schedule_entry(schedules=False)) == ["zeroloss-sweep"]


SCHEDULED = {"SCHEDULE_INTERVAL": 0.5, "SCHEDULES": {"beat-tick": {"queue": "demo.record", "every": 1}}}


@pytest.mark.slow
def test_schedules_run_under_celery_beat_with_the_documented_entry(broker, procs, tmp_path, settings):
    settings.ZEROLOSS = {**settings.ZEROLOSS, **SCHEDULED}
    service = ZeroLossMessageService()
    [never] = overdue_schedules(service.using, service.database_now())
    assert (never.name, never.seen) == ("beat-tick", False)  # no scheduler has run: reported
    scheduled = json.dumps(SCHEDULED)
    procs.append(celery_worker(REDIS_URL, ZEROLOSS_SETTINGS_JSON=scheduled))
    # project/celery.py adds beat_schedule_entry() only, as docs/celery.md shows.
    procs.append(celery_beat(REDIS_URL, tmp_path, ZEROLOSS_SETTINGS_JSON=scheduled))
    ticks = Message.objects.filter(message_id__startswith="beat-tick@", status=Status.COMPLETED)
    assert wait_until(lambda: ticks.count() >= 3, timeout=90), procs[-1].text[-3000:]
    assert overdue_schedules(service.using, service.database_now()) == []


# -- overdue schedules reported ----------------------------------------------------------------


def test_overdue_schedules_in_status_health_and_admin(settings):
    settings.ZEROLOSS = {
        **settings.ZEROLOSS,
        "CACHE_TIMEOUT": 0,
        "SCHEDULES": {
            "hourly": {"queue": "demo.record", "every": 3600},
            "later": {"queue": "demo.record", "cron": "0 3 29 2 *"},
        },
    }
    service = ZeroLossMessageService()
    now = service.database_now()
    [never] = overdue_schedules(service.using, now)  # "later" (29 February) has had no tick to judge
    assert (never.name, never.seen) == ("hourly", False) and never.late > 60

    Scheduler(service.using).run_once()  # a scheduler loads both: their state rows say since when
    assert ScheduleState.objects.count() == 2
    assert overdue_schedules(service.using, service.database_now()) == []
    assert health_report(service, use_cache=False).healthy

    # The last scheduler stopped after the tick two hours back: the next one is over an hour late.
    last = now.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=2)
    ScheduleState.objects.filter(name="hourly").update(last_tick=last, updated_at=last)
    [late] = overdue_schedules(service.using, service.database_now())
    assert (late.name, late.seen, late.due) == ("hourly", True, last + dt.timedelta(hours=1))
    assert 3600 <= late.late < 7300

    report = health_report(service, use_cache=False)
    assert not report.healthy and report.checks["schedules"]["ok"] is False
    assert any("schedule 'hourly': tick" in p and "is a scheduler running?" in p for p in report.problems)

    text = run("zeroloss_status", "--no-cache")
    assert text.code == 0, text.err
    assert "OVERDUE SCHEDULES: 1, no scheduler is sending their ticks" in text.out
    assert "  - hourly: tick " in text.out
    document = json.loads(run("zeroloss_status", "--no-cache", "--json").out)
    assert [o["name"] for o in document["overdue_schedules"]] == ["hourly"]

    from django.contrib.auth.models import User

    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    for url in (reverse("admin:zeroloss_message_dashboard"), reverse("admin:zeroloss_schedule_changelist")):
        html = client.get(url).content.decode()
        assert 'id="zl-overdue-schedules"' in html, url
        assert "1 schedule is overdue: no scheduler is sending its ticks." in html
        assert "hourly: tick " in html

    settings.LANGUAGE_CODE = "de"  # the operator's desk speaks German and French
    html = client.get(reverse("admin:zeroloss_message_dashboard")).content.decode()
    assert "1 Zeitplan ist überfällig: kein Scheduler sendet seine Ticks." in html
    settings.LANGUAGE_CODE = "en-us"

    Scheduler(service.using).run_once()  # a scheduler again: the tick goes out, nothing overdue
    assert overdue_schedules(service.using, service.database_now()) == []
    assert (
        'id="zl-overdue-schedules"'
        not in client.get(reverse("admin:zeroloss_message_dashboard")).content.decode()
    )
