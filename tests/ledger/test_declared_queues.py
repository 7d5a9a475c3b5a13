"""Queues declared without their handler (issue 25, point 8): ``ZEROLOSS["QUEUES"]`` lets a
process that does not import a queue's handler (the web side of a web/worker split) send to it;
``zeroloss_worker`` refuses to run a declared queue it has no handler for (exit 2). Settings are
checked with stable ids (exact check objects). Real databases; one real worker process."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.core.checks import Error
from django.core.management import call_command
from django.core.management.base import CommandError

import zeroloss
from tests.support.processes import db_worker
from zeroloss.conf import QUEUE_OPTIONS, QueueSettings, get_settings
from zeroloss.exceptions import UnknownQueue
from zeroloss.ledger.models import Message
from zeroloss.ops import checks

pytestmark = pytest.mark.django_db(transaction=True)

DECLARED: dict[str, Any] = {"QUEUES": {"emails.outbound": {}}}


def test_a_declared_queue_can_be_sent_to_without_its_handler(settings):
    with pytest.raises(UnknownQueue, match="ZEROLOSS\\['QUEUES'\\] does not declare it"):
        zeroloss.send("emails.outbound", {"to": "a@example.com"})
    settings.ZEROLOSS = DECLARED
    declared = get_settings().QUEUES
    assert declared == {"emails.outbound": QueueSettings()}
    zeroloss.send("emails.outbound", {"to": "a@example.com"}, message_id="e1")
    zeroloss.send_many("emails.outbound", [{"n": 1}, {"n": 2}], message_ids=["e2", "e3"])
    async_to_sync(zeroloss.asend)("emails.outbound", {"n": 4}, message_id="e4")
    assert sorted(Message.objects.values_list("message_id", "queue_name")) == [
        (f"e{i}", "emails.outbound") for i in range(1, 5)
    ]
    with pytest.raises(UnknownQueue, match=r"'emails\.typo'"):  # a typo is still caught
        zeroloss.send("emails.typo", {})
    assert Message.objects.count() == 4


def test_the_worker_refuses_a_declared_queue_it_has_no_handler_for(settings):
    settings.ZEROLOSS = DECLARED
    for args in (["--queue", "emails.outbound"], []):  # named, or "every queue"
        with pytest.raises(CommandError, match=r"emails\.outbound declared in ZEROLOSS") as info:
            call_command("zeroloss_worker", *args, "--burst")
        assert info.value.returncode == 2
    # A worker of other queues is not concerned: another pool serves the declared one.
    call_command(
        "zeroloss_worker",
        "--queue",
        "demo.record",
        "--burst",
        "--no-sweep",
        "--poll-interval",
        "0.05",
        verbosity=0,
    )


@pytest.mark.process
def test_as_a_process_it_exits_2_with_what_to_fix():
    proc = db_worker("--burst", ZEROLOSS_SETTINGS_JSON=json.dumps(DECLARED))
    assert proc.popen.wait(timeout=60) == 2, proc.text
    assert (
        "Queue(s) emails.outbound declared in ZEROLOSS['QUEUES'] have no handler in this process" in proc.text
    )


def test_a_declared_queue_with_a_handler_runs_as_any_other(settings):
    settings.ZEROLOSS = {"QUEUES": {"demo.record": {}}}
    zeroloss.send("demo.record", {}, message_id="r1")
    call_command(
        "zeroloss_worker",
        "--burst",
        "--no-sweep",
        "--queue",
        "demo.record",
        "--poll-interval",
        "0.05",
        verbosity=0,
    )
    assert Message.objects.get(message_id="r1").status == "completed"


@pytest.mark.parametrize(
    ("value", "key", "why"),
    [
        (
            ["emails"],
            "QUEUES",
            "must be a dict of queue name -> options, e.g. {\"emails\": {}}, got ['emails'].",
        ),
        (
            {"no spaces": {}},
            "QUEUES",
            "queue_name 'no spaces' may only use letters, digits, '_', '.', ':' and '-', starting with a "
            "letter or digit.",
        ),
        ({"emails": None}, "QUEUES['emails']", "must be a dict of options ({} for none), got None."),
        (
            {"emails": {"concurency": 4}},
            "QUEUES['emails']",
            f"unknown option 'concurency'; known options: {', '.join(sorted(QUEUE_OPTIONS))}.",
        ),
    ],
)
def test_bad_queues_are_e006(settings, value, key, why):
    settings.ZEROLOSS = {"QUEUES": value}
    assert checks.check_settings() == [
        Error(f"ZEROLOSS[{key!r}]: {why}", hint=why, obj="settings.ZEROLOSS", id="zeroloss.E006")
    ]
