"""The schedule admin: add with field errors, edit, enable/disable, run now, preview, settings read-only."""

from __future__ import annotations

import pytest

from zeroloss.ledger.models import Message
from zeroloss.runtime.schedules.models import Schedule

URL = "/admin/zeroloss/schedule/"

FORM = {
    "name": "db-report",
    "enabled": "on",
    "queue": "demo.record",
    "payload": '{"kind": "daily"}',
    "task": "",
    "args": "[]",
    "kwargs": "{}",
    "cron": "0 3 * * *",
    "every": "",
    "timezone": "Europe/Berlin",
    "priority": "0",
    "ordering_key": "",
    "catch_up": "latest",
    "max_catch_up": "100",
    "overlap": "allow",
}


@pytest.fixture
def with_settings_schedule(settings):
    settings.ZEROLOSS = {
        **settings.ZEROLOSS,
        "SCHEDULES": {"from-settings": {"queue": "demo.record", "every": 30}},
    }


@pytest.mark.parametrize(
    ("change", "field", "text"),
    [
        ({"cron": "61 * * * *"}, "cron", "not a valid cron expression"),
        ({"timezone": "Mars/Olympus"}, "timezone", "not a known IANA time zone"),
        ({"cron": "", "every": "0"}, "every", "> 0"),
        ({"queue": "no.such.queue"}, "queue", "no @zeroloss.handler"),
        ({"cron": "", "every": ""}, None, "got neither"),
        ({"every": "5"}, "cron", "not both"),
        (
            {"queue": "", "task": "tests.infra.task_functions.missing", "payload": "null"},
            "task",
            "cannot be imported",
        ),
        ({"name": "from-settings"}, "name", "already defines"),
    ],
)
def test_the_form_refuses_bad_input_with_field_errors(
    admin_client, with_settings_schedule, change, field, text
):
    response = admin_client.post(f"{URL}add/", {**FORM, **change})
    assert response.status_code == 200  # the form again, nothing saved
    errors = response.context["adminform"].form.errors
    assert text in " ".join(errors.get(field or "__all__", [])), errors
    assert not Schedule.objects.exists()


def test_add_edit_disable_enable_run_now_and_preview(admin_client, with_settings_schedule):
    response = admin_client.post(f"{URL}add/", FORM)
    assert response.status_code == 302, response.context["adminform"].form.errors
    row = Schedule.objects.get(name="db-report")
    assert (row.cron, row.timezone, row.payload) == ("0 3 * * *", "Europe/Berlin", {"kind": "daily"})
    page = admin_client.get(f"{URL}{row.pk}/change/").content.decode()
    assert "T02:00:00+00:00" in page and "T03:00:00+01:00" in page  # the next runs, UTC and local
    response = admin_client.post(f"{URL}{row.pk}/change/", {**FORM, "cron": "", "every": "60"})
    assert response.status_code == 302
    row.refresh_from_db()
    assert (row.cron, row.every) == ("", 60.0)
    admin_client.post(URL, {"action": "disable", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert not row.enabled
    admin_client.post(URL, {"action": "enable", "_selected_action": [row.pk]})
    row.refresh_from_db()
    assert row.enabled
    admin_client.post(URL, {"action": "run_now", "_selected_action": [row.pk]})
    [message] = Message.objects.filter(message_id__startswith="db-report@run-")
    assert (message.queue_name, message.payload) == ("demo.record", {"kind": "daily"})
    listing = admin_client.get(URL).content.decode()
    assert "db-report" in listing
    assert "from-settings" in listing and "read-only" in listing  # settings ones, not editable
