"""The admin's Cancel and Abort actions: permissioned, confirmed, through the ledger; the filter."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from tests.support.admin import CHANGELIST, client_for, confirm_form, feedback, make_user
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService

pytestmark = pytest.mark.django_db

Q = "admin-cancel"


def ledger() -> tuple[ZeroLossMessageService, list[str]]:
    """a0, a1 pending; a2 processing; a3 completed. Returns the service and the pks, in order."""
    service = ZeroLossMessageService(instance_id="w", ack_timeout=600)
    for i in range(4):
        service.persist_message(f"a{i}", Q, {"i": i})
    service.claim_message("a2")
    lease = service.claim_message("a3")
    assert lease is not None and service.acknowledge("a3", lease.token)
    return service, [str(Message.objects.get(message_id=f"a{i}").pk) for i in range(4)]


def post_action(client: Client, action: str, pks: list[str]) -> Any:
    return client.post(
        reverse(CHANGELIST), {"action": action, "select_across": "0", "index": "0", "_selected_action": pks}
    )


def confirm(client: Client, page: Any) -> str:
    form = confirm_form(page.content.decode())
    data: dict[str, list[str]] = {}
    for name, value in form.fields:
        data.setdefault(name, []).append(value)
    return feedback(client, client.post(form.action or reverse(CHANGELIST), data))


def test_cancel_asks_then_cancels_only_the_pending() -> None:
    _, pks = ledger()
    client = client_for(make_user("op", "view_message", "cancel_message"))
    page = post_action(client, "cancel", pks)
    assert page.status_code == 200
    text = page.content.decode()
    assert "Cancel messages?" in text and "2 selected messages are pending and will be cancelled." in text
    assert "1 selected message is running and is left alone (use Abort to stop it)." in text
    assert Message.objects.filter(status=Status.CANCELLED).count() == 0  # nothing before confirming
    html = confirm(client, page)
    assert "2 pending messages were cancelled." in html
    assert "2 selected messages were left alone" in html
    statuses = dict(Message.objects.values_list("message_id", "status"))
    assert statuses == {"a0": "cancelled", "a1": "cancelled", "a2": "processing", "a3": "completed"}
    actors = set(MessageEvent.objects.filter(reason="cancelled_by_operator").values_list("actor", flat=True))
    assert actors == {"op"}  # the admin user


def test_abort_asks_then_stops_the_running_one() -> None:
    _, pks = ledger()
    client = client_for(make_user("op", "view_message", "abort_message"))
    page = post_action(client, "abort", pks)
    text = page.content.decode()
    assert "Abort messages?" in text and "its handler is asked to stop" in text and "a2" in text
    html = confirm(client, page)
    assert "3 messages were cancelled or asked to stop" in html
    message = Message.objects.get(message_id="a2")
    assert message.status == Status.PROCESSING and message.abort_requested_at is not None
    assert MessageEvent.objects.filter(reason="abort_requested", actor="op").count() == 1


@pytest.mark.parametrize("action", ["cancel", "abort"])
def test_each_action_needs_its_permission(action: str) -> None:
    _, pks = ledger()
    other = "abort_message" if action == "cancel" else "cancel_message"
    client = client_for(make_user("viewer", "view_message", other))
    changelist = client.get(reverse(CHANGELIST)).content.decode()
    assert f'value="{action}"' not in changelist
    response = post_action(client, action, pks)
    # Django refuses an action the user may not run: no confirmation page, nothing changed.
    assert response.status_code in (200, 302, 403)
    assert "zl-confirm-form" not in response.content.decode()
    assert not Message.objects.filter(status=Status.CANCELLED).exists()
    assert Message.objects.get(message_id="a2").abort_requested_at is None


def test_cancelled_is_a_status_of_the_list_filter() -> None:
    service, _ = ledger()
    service.cancel_messages(["a0"])
    client = client_for(make_user("root", superuser=True))
    html = client.get(reverse(CHANGELIST) + "?status__exact=cancelled").content.decode()
    # The ids as the list shows them (a bare "a1" can occur in the page's random CSRF token).
    assert ">a0<" in html and ">a1<" not in html
    assert "?status__exact=cancelled" in client.get(reverse(CHANGELIST)).content.decode()
