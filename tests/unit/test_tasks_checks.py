"""System checks of zeroloss task backends (``TASKS``): exact check objects, stable ids."""

from __future__ import annotations

import pytest
from django.core.checks import Error, Warning
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from zeroloss.ops import checks

BACKEND = "zeroloss.tasks_backend.ZeroLossBackend"


def test_the_projects_tasks_setting_is_clean():
    assert checks.check_tasks() == []


def test_no_tasks_setting_no_messages(settings):
    del settings.TASKS
    assert checks.check_tasks() == []
    assert checks.tasks_messages({}, set(), framework=False) == []


def test_other_backends_are_not_ours(settings):
    settings.TASKS = {"default": {"BACKEND": "django.tasks.backends.dummy.DummyBackend", "QUEUES": [1]}}
    assert checks.check_tasks() == []


@pytest.mark.parametrize("queues", ["default", {"default": 1}, None])
def test_queues_not_a_list_of_names_is_e020(queues):
    assert checks.tasks_messages({"default": {"BACKEND": BACKEND, "QUEUES": queues}}, set(), True) == [
        Error(
            f"TASKS['default']['QUEUES'] must be a list of queue names ([] for any queue), got {queues!r}.",
            hint='For example "QUEUES": ["default"].',
            obj="settings.TASKS",
            id="zeroloss.E020",
        )
    ]


def test_empty_queues_is_any_queue_not_an_error():
    assert checks.tasks_messages({"default": {"BACKEND": BACKEND, "QUEUES": []}}, set(), True) == []


def test_an_invalid_queue_name_is_e020(settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "no spaces"]}}
    assert checks.check_tasks() == [
        Error(
            "TASKS['default']['QUEUES']: queue_name 'no spaces' may only use letters, digits, '_', '.', ':' "
            "and '-', starting with a letter or digit.",
            hint="Each task queue is a zeroloss queue: use a valid queue name.",
            obj="settings.TASKS",
            id="zeroloss.E020",
        )
    ]


def test_a_task_queue_that_a_handler_owns_is_e021(settings):
    settings.TASKS = {"tasks": {"BACKEND": BACKEND, "QUEUES": ["default", "demo.record"]}}
    assert checks.check_tasks() == [
        Error(
            "TASKS['tasks']['QUEUES'] lists 'demo.record', which is also the queue of a @zeroloss.handler: a "
            "queue has one owner, and its handler would be given the tasks' messages.",
            hint="Give the task queue or the handler's queue another name.",
            obj="settings.TASKS",
            id="zeroloss.E021",
        )
    ]


def test_options_not_a_dict_is_e022():
    assert checks.tasks_messages(
        {"default": {"BACKEND": BACKEND, "OPTIONS": ["MAX_ATTEMPTS"]}}, set(), True
    ) == [
        Error(
            "TASKS['default']['OPTIONS'] must be a dict, got ['MAX_ATTEMPTS'].",
            hint="Known options: MAX_ATTEMPTS.",
            obj="settings.TASKS",
            id="zeroloss.E022",
        )
    ]


def test_an_unknown_option_is_e022_and_fails_manage_py_check(settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "OPTIONS": {"MAX_ATTEMPT": 3}}}
    assert checks.check_tasks() == [
        Error(
            "TASKS['default']['OPTIONS'] has an unknown option 'MAX_ATTEMPT'.",
            hint="Known options: MAX_ATTEMPTS.",
            obj="settings.TASKS",
            id="zeroloss.E022",
        )
    ]
    with pytest.raises(SystemCheckError, match=r"zeroloss\.E022"):
        call_command("check")


@pytest.mark.parametrize("value", [0, -1, 2.5, "3", True, 10**9])
def test_an_invalid_max_attempts_is_e023(value):
    [message] = checks.tasks_messages(
        {"t": {"BACKEND": BACKEND, "OPTIONS": {"MAX_ATTEMPTS": value}}}, set(), True
    )
    assert message == Error(
        f"TASKS['t']['OPTIONS']['MAX_ATTEMPTS'] must be an integer from 1 to {checks_limit()}, got {value!r}.",
        hint="Leave it out to use ZEROLOSS['MAX_ATTEMPTS'].",
        obj="settings.TASKS",
        id="zeroloss.E023",
    )


def checks_limit() -> int:
    from zeroloss.ledger.validation import MAX_ATTEMPTS_LIMIT

    return MAX_ATTEMPTS_LIMIT


def test_no_tasks_framework_installed_is_w020():
    backends = {"default": {"BACKEND": BACKEND, "QUEUES": ["default"]}}
    assert checks.tasks_messages(backends, set(), framework=False) == [
        Warning(
            "TASKS names zeroloss's backend (default) but no Tasks framework is installed: Django 6 has "
            "django.tasks built in; on Django 5.2 install the django-tasks backport (pip install "
            "'zeroloss[tasks]'). Until then @task and TASKS do nothing.",
            hint="pip install 'zeroloss[tasks]', or remove TASKS.",
            obj="settings.TASKS",
            id="zeroloss.W020",
        )
    ]
    assert checks.tasks_messages(backends, set(), framework=True) == []


def test_the_framework_is_installed_here():
    from zeroloss.integrations.tasks_backend.queues import framework_available

    assert framework_available() is True


@pytest.mark.process
def test_without_a_tasks_framework_zeroloss_still_works_and_warns(tmp_path):
    """Django 5.2 without the backport: handler queues, unknown queues and the checks behave, and
    TASKS naming zeroloss's backend is W020 (the framework's imports are blocked in a child)."""
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT, child_env

    code = """
import json, sys
sys.modules["django.tasks"] = None  # an import of either now raises ImportError
sys.modules["django_tasks"] = None
import django
django.setup()
from zeroloss.integrations.tasks_backend import checks
from zeroloss.runtime import handlers
from zeroloss.exceptions import UnknownQueue
try:
    handlers.get_handler("no.such.queue")
    unknown = "found"
except UnknownQueue:
    unknown = "UnknownQueue"
print(json.dumps({
    "unknown": unknown,
    "record": handlers.get_handler("demo.record").name,
    "queues": handlers.registered_queues(),
    "checks": [m.id for m in checks.check_tasks()],
}))
"""
    env = child_env(DJANGO_SETTINGS_MODULE="project.settings", ZEROLOSS_VAR_DIR=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["unknown"] == "UnknownQueue"
    assert result["record"] == "project.demo.zeroloss_handlers.record"
    assert "demo.record" in result["queues"] and "demo.tasks" not in result["queues"]  # TASKS is inert
    assert result["checks"] == ["zeroloss.W020"]


def test_zeroloss_missing_from_installed_apps_is_e024_and_enqueue_refuses(settings):
    from django.core.exceptions import ImproperlyConfigured

    from tests.infra import task_functions as tf
    from zeroloss.integrations.tasks_backend import compat

    expected = Error(
        "TASKS['default'] is zeroloss's backend, but \"zeroloss\" is not in INSTALLED_APPS: its tasks would "
        "be stored in tables that do not exist, and no zeroloss check would run.",
        hint='Add "zeroloss" to INSTALLED_APPS, then run manage.py migrate (it creates the ledger\'s tables).',
        obj="settings.TASKS",
        id="zeroloss.E024",
    )
    backend = compat.task_backends["default"]
    assert list(backend.check()) == []  # installed: zeroloss's own checks speak
    settings.INSTALLED_APPS = [
        app for app in settings.INSTALLED_APPS if app not in ("zeroloss", "project.demo")
    ]
    assert list(backend.check()) == [expected]
    with pytest.raises(SystemCheckError) as failed:
        call_command("check")
    assert str(failed.value).count("zeroloss.E024") == 1  # the framework's check or ours, never both
    with pytest.raises(ImproperlyConfigured, match=r'"zeroloss" is not in INSTALLED_APPS.*manage.py migrate'):
        tf.add.enqueue(1, 2)
