"""The schedule admin in a real browser (headless Chromium, as tests/browser/test_admin_browser.py):
add with a field error then fixed, preview, run now, disable; settings schedules read-only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.browser import test_admin_browser
from zeroloss.ledger.models import Message
from zeroloss.runtime.schedules.models import Schedule

Shots = test_admin_browser.Shots
browser_page = test_admin_browser.browser_page  # the fixture: headless Debian Chromium


# Chromium is a process, and the pages are plain admin: the same on every Django version and
# database, so the first PostgreSQL pass runs it.
@pytest.mark.once
@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_schedule_pages_in_a_real_browser(
    live_server: Any, browser_page: Any, tmp_path: Path, settings
) -> None:
    settings.ZEROLOSS = {
        **settings.ZEROLOSS,
        "SCHEDULES": {"heartbeat": {"queue": "demo.record", "every": 30}},
    }
    User.objects.create_superuser("admin", password="correct horse battery staple")
    page, base, shots = browser_page, live_server.url, Shots(tmp_path)
    page.goto(f"{base}/admin/login/?next=/admin/zeroloss/schedule/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "correct horse battery staple")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/zeroloss/schedule/")
    assert "heartbeat" in page.inner_text("#zl-settings-schedules")  # settings: listed, read-only
    assert page.locator("#zl-settings-schedules a").count() == 0

    page.goto(f"{base}/admin/zeroloss/schedule/add/")
    page.fill("#id_name", "nightly-report")
    page.fill("#id_queue", "demo.record")
    page.fill("#id_payload", '{"kind": "daily"}')
    page.fill("#id_cron", "0 25 * * *")  # no hour 25
    page.fill("#id_timezone", "Europe/Berlin")
    page.click("input[name=_continue]")
    assert "not a valid cron expression" in page.inner_text(".field-cron .errorlist")
    assert not Schedule.objects.exists()
    shots.take(page, "schedule-field-error.png")
    page.fill("#id_cron", "0 3 * * *")
    page.click("input[name=_continue]")
    page.wait_for_selector(".field-next_runs")
    runs = page.inner_text(".field-next_runs")
    assert "T02:00:00+00:00" in runs and "T03:00:00+01:00" in runs  # UTC and Berlin's winter time
    shots.take(page, "schedule-change.png")

    page.goto(f"{base}/admin/zeroloss/schedule/")
    page.check("input[name=_selected_action]")
    page.select_option("select[name=action]", "run_now")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    assert Message.objects.filter(message_id__startswith="nightly-report@run-").count() == 1
    page.check("input[name=_selected_action]")
    page.select_option("select[name=action]", "disable")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    assert not Schedule.objects.get(name="nightly-report").enabled
    shots.take(page, "schedule-list.png")
