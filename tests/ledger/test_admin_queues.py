"""The admin's *Queues* page (docs/admin.md): every queue, whatever made it known, with its counts,
throughput, oldest pending message, state and limits, and pause / resume / limit actions for any
of them (a queue without a control row too): permissioned, confirmed, recorded with the operator.
The queue-controls list says "Paused" or "Running" in words."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from zeroloss.admin.queue_page import queue_lines
from zeroloss.ledger.models import QueueControl
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.runtime.schedules.models import Schedule

pytestmark = pytest.mark.django_db

URL = "admin:zeroloss_queuecontrol_queues"


@pytest.fixture(autouse=True)
def _fresh(settings: Any) -> None:
    cache.clear()  # the page's counts come from the cached snapshot
    settings.ZEROLOSS = {**settings.ZEROLOSS, "QUEUES": {"declared.only": {"concurrency": 4}}}


def client_with(*codenames: str) -> Client:
    user = User.objects.create_user("-".join(codenames) or "nobody", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def row(html: str, queue: str) -> str:
    start = html.index(f'data-queue="{queue}"')
    return html[start : html.index("</tr>", start)]


def test_every_queue_is_listed_with_its_counts_throughput_age_state_and_limits() -> None:
    service = ZeroLossMessageService(instance_id="w")
    service.persist_message("l1", "ledger.only", {})
    service.persist_message("l2", "ledger.only", {})
    [lease] = service.claim("ledger.only")
    assert service.acknowledge(lease.message_id, lease.token)  # completed now: this minute's throughput
    service.pause_queue("controlled.only", actor="ops")
    Schedule.objects.create(name="tick", queue="scheduled.only", every=60, payload={})

    lines = {line.name: line for line in queue_lines(service, refresh=True)[0]}
    assert {"declared.only", "ledger.only", "controlled.only", "scheduled.only", "demo.record"} <= set(lines)
    assert lines["declared.only"].sources == ("declared",)
    assert lines["demo.record"].sources == ("handler",)  # a handler of this process
    assert lines["scheduled.only"].sources == ("schedule",)
    assert lines["controlled.only"].sources == ("control",)
    ledger = lines["ledger.only"]
    assert ledger.sources == ("ledger",)
    assert (ledger.total, ledger.completed_recently) == (2, 1)
    assert ledger.oldest_pending  # the pending one's age
    assert not ledger.paused and lines["controlled.only"].paused
    assert lines["controlled.only"].changed_by == "ops"
    assert lines["declared.only"].concurrency == 4  # the setting's limit, no override
    assert lines["declared.only"].override_concurrency is None

    viewer = client_with("view_queuecontrol")
    page = viewer.get(reverse(URL))
    assert page.status_code == 200
    html = page.content.decode()
    assert "Paused" in row(html, "controlled.only") and "Running" not in row(html, "controlled.only")
    assert "Running" in row(html, "ledger.only")
    assert "concurrency 4" in row(html, "declared.only")
    assert "0.2" in row(html, "ledger.only")  # 1 completed in the last 5 minutes, per minute
    # A viewer is offered no action, and a forged one is refused.
    assert 'value="pause"' not in html
    forged = viewer.post(reverse(URL), {"action": "pause", "queue": "ledger.only", "post": "yes"})
    assert forged.status_code == 403
    assert not QueueControl.objects.filter(queue_name="ledger.only").exists()


def test_pause_resume_and_limit_any_queue_after_confirming_as_the_operator() -> None:
    ops = client_with("view_queuecontrol", "change_queuecontrol")
    url = reverse(URL)
    assert 'value="pause"' in ops.get(url).content.decode()

    # A queue never paused has no control row: the page pauses it all the same, once confirmed.
    asked = ops.post(url, {"action": "pause", "queue": "demo.record"})
    assert asked.status_code == 200 and "Pause queue demo.record?" in asked.content.decode()
    assert not QueueControl.objects.filter(queue_name="demo.record").exists()  # asked, not done
    done = ops.post(url, {"action": "pause", "queue": "demo.record", "post": "yes"}, follow=True)
    assert "Paused queue demo.record" in done.content.decode()
    control = QueueControl.objects.get(queue_name="demo.record")
    assert control.paused and control.changed_by == "view_queuecontrol-change_queuecontrol"

    ops.post(url, {"action": "resume", "queue": "demo.record", "post": "yes"})
    assert QueueControl.objects.get(queue_name="demo.record").paused is False

    form = ops.post(url, {"action": "limit", "queue": "demo.record"})
    assert form.status_code == 200 and 'name="concurrency"' in form.content.decode()
    ops.post(
        url, {"action": "limit", "queue": "demo.record", "concurrency": "3", "rate": "10/s", "post": "yes"}
    )
    control = QueueControl.objects.get(queue_name="demo.record")
    assert (control.concurrency, control.rate) == (3, "10/s")
    # The form starts from the overrides in place; empty fields clear them.
    again = ops.post(url, {"action": "limit", "queue": "demo.record"}).content.decode()
    assert 'value="3"' in again and 'value="10/s"' in again
    ops.post(url, {"action": "limit", "queue": "demo.record", "concurrency": "", "rate": "", "post": "yes"})
    control = QueueControl.objects.get(queue_name="demo.record")
    assert (control.concurrency, control.rate) == (None, "")


@pytest.mark.parametrize(
    ("concurrency", "rate", "says"),
    [("zero", "", "Concurrency must be a whole number"), ("0", "", "from 1"), ("", "10/day", "Rate must be")],
)
def test_a_bad_limit_changes_nothing_and_says_what_to_write(concurrency: str, rate: str, says: str) -> None:
    ZeroLossMessageService().limit_queue("demo.record", concurrency=2, actor="before")
    ops = client_with("view_queuecontrol", "change_queuecontrol")
    answer = ops.post(
        reverse(URL),
        {"action": "limit", "queue": "demo.record", "concurrency": concurrency, "rate": rate, "post": "yes"},
    )
    assert answer.status_code == 200
    html = answer.content.decode()
    assert says in html and "Nothing was changed" in html
    control = QueueControl.objects.get(queue_name="demo.record")
    assert (control.concurrency, control.rate, control.changed_by) == (2, "", "before")


def test_a_bad_queue_name_or_action_is_refused() -> None:
    ops = client_with("view_queuecontrol", "change_queuecontrol")
    assert ops.post(reverse(URL), {"action": "drop", "queue": "demo.record"}).status_code == 400
    answer = ops.post(reverse(URL), {"action": "pause", "queue": "bad queue\x00", "post": "yes"})
    assert answer.status_code == 200 and 'class="errornote"' in answer.content.decode()
    assert not QueueControl.objects.exists()


def test_no_permission_no_page() -> None:
    assert client_with().get(reverse(URL)).status_code == 403
    assert Client().get(reverse(URL)).status_code == 302  # to the login page


def test_the_controls_list_says_paused_or_running_in_words_and_the_dashboard_links_the_page() -> None:
    service = ZeroLossMessageService()
    service.pause_queue("demo.record", actor="ops")
    service.limit_queue("demo.orders", concurrency=2, actor="ops")
    root = Client()
    root.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    html = root.get(reverse("admin:zeroloss_queuecontrol_changelist")).content.decode()
    assert "zl-state-paused" in html and "zl-state-running" in html
    assert "icon-yes.svg" not in html and "icon-no.svg" not in html  # no bare check mark
    dashboard = root.get(reverse("admin:zeroloss_message_dashboard")).content.decode()
    assert reverse(URL) in dashboard
    assert reverse(URL) in root.get(reverse("admin:app_list", args=["zeroloss"])).content.decode()
