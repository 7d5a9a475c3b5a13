"""Admin actions at the edges: vanished messages, "select all" across pages, big selections.

Every message is made through the service. The only direct UPDATE moves leases into the
past (how tests expire a lease deterministically); the only delete is the service's purge.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from zeroloss.models import Message, MessageEvent, Status
from zeroloss.service import ZeroLossMessageService

CHANGELIST = "admin:zeroloss_message_changelist"


def root_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def persist(service: ZeroLossMessageService, queue: str, count: int, prefix: str, batch: int = 5000) -> None:
    for start in range(0, count, batch):
        service.persist_messages(
            [(f"{prefix}-{i}", queue, {"i": i}) for i in range(start, min(start + batch, count))]
        )


def make_dead(service: ZeroLossMessageService, message_id: str, queue: str) -> None:
    service.persist_message(message_id, queue, {"id": message_id}, max_attempts=1)
    lease = service.mark_processing(message_id)
    assert lease
    assert service.mark_failed(message_id, lease.token, "boom")


def first_page_pks(queue: str) -> list[str]:
    """What the changelist's own form posts: the checkboxes of the rows on screen."""
    pks = Message.objects.filter(queue_name=queue).order_by("-id").values_list("pk", flat=True)[:50]
    return [str(pk) for pk in pks]


def feedback(client: Client, response: Any) -> str:
    assert response.status_code == 302, response.content[:2000]
    return client.get(response["Location"]).content.decode()


class ConfirmForm(HTMLParser):
    """The fields and target of the confirmation page's form, as a browser would submit them."""

    def __init__(self) -> None:
        super().__init__()
        self.inside = False
        self.action: str | None = None
        self.fields: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form" and "zl-confirm-form" in (a.get("class") or ""):
            self.inside = True
            self.action = a.get("action")
        elif self.inside and tag == "input" and a.get("type") == "hidden" and a.get("name"):
            self.fields.append((a["name"] or "", a.get("value") or ""))

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False


def confirm_form(html: str) -> ConfirmForm:
    form = ConfirmForm()
    form.feed(html)
    assert form.fields, "the confirmation page has no form"
    return form


@contextmanager
def purge_when_the_service_checks_ids(queue: str) -> Iterator[list[str]]:
    """Purge ``queue``'s dead letters at the exact moment the service looks the ids up.

    That is the race a real operator meets: the page and the selection were read, then a
    purge (``zeroloss_purge``, another operator) deletes a selected message before the
    action reaches it. The purge is the service's own, on the same database.
    """
    fired: list[str] = []

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if not fired and '"zeroloss_message"."message_id" IN' in sql:
            fired.append(sql)
            ZeroLossMessageService(instance_id="purger").purge_messages(
                status=Status.DEAD, older_than=0, queue_name=queue
            )
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield fired


# -- (a) a message that vanished between the page and the POST ------------------------


@pytest.mark.parametrize("action", ["redrive", "requeue_stuck", "force_requeue", "dead_letter"])
def test_action_names_a_message_that_vanished_meanwhile(db: None, action: str) -> None:
    worker = ZeroLossMessageService(instance_id="worker-1", ack_timeout=600)
    for mid in ("keep", "gone"):
        make_dead(worker, mid, "emails" if mid == "keep" else "doomed")
    if action != "redrive":
        # The other actions need live messages: redrive both to pending (and claim them).
        worker.redrive_messages(["keep", "gone"], actor="setup")
        if action in ("requeue_stuck", "force_requeue"):
            assert worker.mark_processing("keep")
            assert worker.mark_processing("gone")
            if action == "requeue_stuck":
                Message.objects.filter(message_id__in=["keep", "gone"]).update(
                    lease_expires_at=Now() - dt.timedelta(minutes=1)
                )
        # Dead again only at purge time, so the purge can take it: dead-letter "gone" in the race.
    client = root_client()
    pks = [str(Message.objects.get(message_id=m).pk) for m in ("keep", "gone")]
    data: dict[str, Any] = {"action": action, "_selected_action": pks, "index": "0", "post": "yes"}
    if action == "dead_letter":
        data["reason"] = "stop"

    @contextmanager
    def vanish() -> Iterator[list[str]]:
        if action == "redrive":
            with purge_when_the_service_checks_ids("doomed") as fired:
                yield fired
            return
        # A live message is not purgeable: it is dead-lettered and purged in the race.
        fired: list[str] = []

        def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, ctx: Any) -> Any:
            if not fired and '"zeroloss_message"."message_id" IN' in sql:
                fired.append(sql)
                other = ZeroLossMessageService(instance_id="other-operator")
                other.dead_letter_messages(["gone"], reason="race", actor="other")
                other.purge_messages(status=Status.DEAD, older_than=0, queue_name="doomed")
            return execute(sql, params, many, ctx)

        with connection.execute_wrapper(wrapper):
            yield fired

    with vanish() as fired:
        html = feedback(client, client.post(reverse(CHANGELIST), data))
    assert fired, "the service never looked the selected ids up: the race was not staged"
    assert not Message.objects.filter(message_id="gone").exists()
    assert "No message with id" not in html  # the exception's text is not the id
    assert "Message &#x27;gone&#x27; no longer exists" in html or "Message 'gone' no longer exists" in html
    # The message that still exists was acted on.
    keep = Message.objects.get(message_id="keep")
    expected = {"redrive": Status.PENDING, "requeue_stuck": Status.PENDING, "force_requeue": Status.PENDING}
    assert keep.status == expected.get(action, Status.DEAD)
    assert MessageEvent.objects.filter(message=keep, actor="root").count() == 1


# -- (c) select all across pages, past PostgreSQL's 65,535 bind parameters ------------


@pytest.fixture
def server_side_binding(transactional_db: None) -> Iterator[None]:
    """PostgreSQL with server-side parameter binding (Django's ``server_side_binding`` option).

    There every ``%s`` is a real bind parameter, and a statement may carry at most 65,535
    of them. (Django's default client-side binding inlines the values instead: no limit,
    only a statement of megabytes.)
    """
    import psycopg

    options = connection.settings_dict.setdefault("OPTIONS", {})
    saved = dict(options)
    connection.close()
    options["server_side_binding"] = True
    try:
        connection.ensure_connection()
        assert not issubclass(connection.connection.cursor_factory, psycopg.ClientCursor)
        yield
    finally:
        connection.close()
        options.clear()
        options.update(saved)


@pytest.mark.postgres_only
def test_select_all_across_more_than_65535_messages(server_side_binding: None) -> None:
    count = 70_500
    persist(ZeroLossMessageService(instance_id="bulk-worker"), "bulk", count, "bulk")
    ZeroLossMessageService().persist_message("bystander", "other", {})
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE zeroloss_message")  # what autovacuum does to a table this size
    client = root_client()
    # What the confirmation page of "Dead-letter by hand" submits after "Select all 70500".
    response = client.post(
        reverse(CHANGELIST) + "?queue=bulk",
        {
            "action": "dead_letter",
            "select_across": "1",
            "index": "0",
            "post": "yes",
            "reason": "queue retired",
            "_selected_action": first_page_pks("bulk"),
        },
    )
    html = feedback(client, response)
    assert f"{count} messages were dead-lettered." in html
    assert Message.objects.filter(queue_name="bulk", status=Status.DEAD).count() == count
    assert MessageEvent.objects.filter(reason="dead_lettered_by_operator", actor="root").count() == count
    assert Message.objects.get(message_id="bystander").status == Status.PENDING
