"""The admin's workflows: the list, a page per workflow (steps by level, what each waits for, what
blocks it), its redrive and cancel actions (permissioned, confirmed, audited), the message page's
link to its workflow, and the waiting status wherever the admin shows statuses. Both passes."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from tests.support.admin import CHANGELIST, client_for, confirm_form, feedback, make_user
from tests.support.workflows import HEALED, blocked_workflow, statuses
from zeroloss.ledger.models import Message, MessageEvent, Status, Workflow
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.testing import drain

pytestmark = pytest.mark.django_db

BLOCKED = {"A": "completed", "B": "dead", "C": "completed", "D": "waiting", "E": "waiting"}


def page_url(wid: str = "ops") -> str:
    return reverse("admin:zeroloss_workflow_change", args=[Workflow.objects.get(workflow_id=wid).pk])


def action_url(action: str, wid: str = "ops") -> str:
    return reverse(f"admin:zeroloss_workflow_{action}", args=[Workflow.objects.get(workflow_id=wid).pk])


def confirm(client: Client, page: Any) -> str:
    assert page.status_code == 200, page.content[:2000]
    form = confirm_form(page.content.decode())
    data: dict[str, list[str]] = {}
    for name, value in form.fields:
        data.setdefault(name, []).append(value)
    assert form.action
    return feedback(client, client.post(form.action, data))


def rows_by_level(html: str) -> dict[str, list[tuple[str, str]]]:
    """``{level: [(step, status), ...]}`` as the page's table shows them."""
    levels: dict[str, list[tuple[str, str]]] = {}
    for level, body in re.findall(r'<tbody class="zl-level" data-level="(\d+)">(.*?)</tbody>', html, re.S):
        levels[level] = re.findall(r'data-step="([^"]+)">.*?<span class="zl-badge zl-(\w+)">', body, re.S)
    return levels


def step_row(html: str, name: str) -> str:
    match = re.search(rf'<tr class="zl-step" data-step="{name}">(.*?)</tr>', html, re.S)
    assert match, name
    return match.group(1)


def test_the_workflow_list_shows_each_with_its_progress() -> None:
    blocked_workflow()
    client = client_for(make_user("viewer", "view_message"))
    html = client.get(reverse("admin:zeroloss_workflow_changelist")).content.decode()
    assert ">ops<" in html
    assert "3 of 5 finished" in html and "1 dead" in html
    blocked_workflow("fine")
    HEALED.add("fine/B")
    # "fine" is blocked like "ops"; redriven and drained, it finishes.
    ZeroLossMessageService().redrive_messages(["fine/B"], actor="op")
    drain()
    listed = reverse("admin:zeroloss_workflow_changelist")
    for progress, shown in (
        ("dead_steps", {"ops"}),
        ("unfinished", {"ops"}),
        ("finished", {"fine"}),
        ("", {"ops", "fine"}),
    ):
        page = client.get(f"{listed}?progress={progress}" if progress else listed).content.decode()
        assert {w for w in ("ops", "fine") if f">{w}<" in page} == shown, progress
    found = client.get(reverse("admin:zeroloss_workflow_changelist") + "?q=op").content.decode()
    none = client.get(reverse("admin:zeroloss_workflow_changelist") + "?q=zz").content.decode()
    assert ">ops<" in found and ">ops<" not in none


def test_the_page_shows_steps_by_level_what_each_waits_for_and_the_blocked_reason() -> None:
    assert blocked_workflow() == BLOCKED
    client = client_for(make_user("viewer", "view_message"))
    response = client.get(page_url())
    assert response.status_code == 200
    html = response.content.decode()
    assert rows_by_level(html) == {
        "0": [("A", "completed")],
        "1": [("B", "dead"), ("C", "completed")],
        "2": [("D", "waiting")],
        "3": [("E", "waiting")],
    }
    d = step_row(html, "D")
    assert "<td>0 / 5</td><td>B</td>" in d.replace("\n", "")
    assert '<span class="zl-badge zl-dead">B</span>' in d
    assert '<span class="zl-badge zl-dead">B</span>' in step_row(html, "E")  # held through D
    assert "the warehouse said no" in step_row(html, "B")
    assert "{&#x27;step&#x27;: &#x27;ops/C&#x27;}" in step_row(html, "C")  # its result
    blocked = re.search(r'id="zl-workflow-blocked">(.*?)</div>', html, re.S)
    assert blocked and "<strong>B</strong> (ops/B)" in blocked.group(1) and "holds D, E" in blocked.group(1)
    assert "zeroloss.Fail: the warehouse said no" in blocked.group(1)
    d_pk = Message.objects.get(message_id="ops/D").pk
    assert reverse("admin:zeroloss_message_change", args=[d_pk]) in d
    # Its steps in the message list, by the workflow: search.
    steps = re.search(r'<a href="([^"]+)" id="zl-workflow-steps-link">', html)
    assert steps
    listed = client.get(steps.group(1).replace("&amp;", "&")).content.decode()
    assert all(f">ops/{n}<" in listed for n in "ABCDE")
    # A viewer is offered no action.
    assert "zl-workflow-actions" not in html


def test_redrive_asks_then_redrives_and_the_dependents_complete() -> None:
    blocked_workflow()
    client = client_for(make_user("op", "view_message", "redrive_message"))
    html = client.get(page_url()).content.decode()
    assert "Redrive the dead steps" in html and "Cancel the workflow" not in html
    page = client.post(action_url("redrive"))
    text = page.content.decode()
    assert "Redrive the dead steps of workflow ops?" in text and "holds D, E" in text
    assert statuses() == BLOCKED  # nothing before confirming
    HEALED.add("ops/B")  # the fix is deployed
    done = confirm(client, page)
    assert "1 dead step was redriven to pending (attempts reset)." in done
    assert statuses()["B"] == "pending"
    events = MessageEvent.objects.filter(reason="redriven_by_operator")
    assert list(events.values_list("message__message_id", "actor")) == [("ops/B", "op")]
    drain()
    assert set(statuses().values()) == {"completed"}
    assert "zl-workflow-blocked" not in client.get(page_url()).content.decode()


def test_cancel_asks_then_cancels_every_unfinished_step() -> None:
    blocked_workflow()
    client = client_for(make_user("op", "view_message", "cancel_workflow"))
    page = client.post(action_url("cancel"))
    text = page.content.decode()
    assert "Cancel workflow ops?" in text and "2 steps have not finished and will be cancelled." in text
    assert statuses() == BLOCKED
    done = confirm(client, page)
    assert "Workflow ops: 2 step(s) cancelled, 0 running step(s) asked to stop" in done
    assert statuses() == BLOCKED | {"D": "cancelled", "E": "cancelled"}
    events = MessageEvent.objects.filter(reason="cancelled_by_operator")
    assert sorted(events.values_list("message__message_id", "actor")) == [("ops/D", "op"), ("ops/E", "op")]
    # Nothing left to cancel: the page offers no cancel, the action says so and changes nothing.
    assert "Cancel the workflow" not in client.get(page_url()).content.decode()
    again = feedback(client, client.post(action_url("cancel")))
    assert "nothing to cancel" in again


@pytest.mark.parametrize(("action", "other"), [("redrive", "cancel_workflow"), ("cancel", "redrive_message")])
def test_each_action_needs_its_permission(action: str, other: str) -> None:
    blocked_workflow()
    before = list(MessageEvent.objects.values_list("id", flat=True))
    client = client_for(make_user("viewer", "view_message", other))
    assert client.post(action_url(action)).status_code == 403
    assert client.post(action_url(action), {"post": "yes", "step": "ops/B"}).status_code == 403
    assert statuses() == BLOCKED
    assert list(MessageEvent.objects.values_list("id", flat=True)) == before
    anonymous = Client().post(action_url(action), {"post": "yes", "step": "ops/B"})
    assert anonymous.status_code == 302 and "login" in anonymous["Location"]
    assert statuses() == BLOCKED


def test_redrive_refuses_a_step_of_another_workflow() -> None:
    blocked_workflow()
    blocked_workflow("other")
    client = client_for(make_user("op", "view_message", "redrive_message"))
    response = client.post(action_url("redrive"), {"post": "yes", "step": "other/B"})
    assert response.status_code == 400
    assert statuses("other")["B"] == "dead"


def test_the_message_page_links_to_its_workflow_and_says_why_it_waits() -> None:
    blocked_workflow()
    ZeroLossMessageService().persist_message("plain", "q", {})
    plain = Message.objects.get(message_id="plain")
    client = client_for(make_user("root", superuser=True))
    d = Message.objects.get(message_id="ops/D")
    html = client.get(reverse("admin:zeroloss_message_change", args=[d.pk])).content.decode()
    assert f'<a href="{page_url()}" id="zl-workflow-link">ops (step D)</a>' in html
    assert "waiting for its dependencies (steps of workflow ops) to complete" in html
    other = client.get(reverse("admin:zeroloss_message_change", args=[plain.pk])).content.decode()
    assert "zl-workflow-link" not in other


def test_waiting_is_a_status_of_the_list_filter_and_the_queue_page() -> None:
    blocked_workflow()
    client = client_for(make_user("root", superuser=True))
    changelist = client.get(reverse(CHANGELIST)).content.decode()
    assert "?status__exact=waiting" in changelist
    waiting = client.get(reverse(CHANGELIST) + "?status__exact=waiting").content.decode()
    assert ">ops/D<" in waiting and ">ops/E<" in waiting and ">ops/A<" not in waiting
    label = str(Status.WAITING.label).lower()
    for page in ("admin:zeroloss_queuecontrol_queues", "admin:zeroloss_message_dashboard"):
        html = client.get(reverse(page) + "?refresh=1").content.decode()
        table = html[html.index('<table class="zl-table') :]
        assert f">{label}</th>" in table.split("</thead>")[0], page  # its column
        row = re.search(r">wfops\.ok</a>(.*?)</tr>", table, re.S)
        assert row, page
        counts = re.findall(r'<td class="zl-num">(\d+)</td>', row.group(1))[: len(Status.values)]
        assert counts[Status.values.index(Status.WAITING)] == "2", (page, counts)


@pytest.mark.parametrize(
    ("lang", "phrases"),
    [
        ("de", ["Ebene 0", "wartet auf", "toter Schritt"]),
        ("fr", ["Niveau 0", "attend", "étape en lettre morte"]),
    ],
)
def test_the_workflow_page_speaks_the_language(settings: Any, lang: str, phrases: list[str]) -> None:
    blocked_workflow()
    settings.LANGUAGE_CODE = lang
    client = client_for(make_user("root", superuser=True), headers={"accept-language": lang})
    html = client.get(page_url()).content.decode()
    assert all(p in html for p in phrases), [p for p in phrases if p not in html]
    assert "Level 0" not in html and "waits for" not in html


def test_a_workflow_whose_steps_are_gone_says_so_and_offers_nothing() -> None:
    Workflow.objects.create(workflow_id="gone", fingerprint="0" * 64, steps=3, created_at=timezone.now())
    client = client_for(make_user("root", superuser=True))
    html = client.get(page_url("gone")).content.decode()
    assert "No step of this workflow is in the ledger any more (purged)." in html
    assert "zl-workflow-actions" not in html
    assert "nothing to cancel" in feedback(client, client.post(action_url("cancel", "gone")))
    assert "no dead step to redrive" in feedback(client, client.post(action_url("redrive", "gone")))
