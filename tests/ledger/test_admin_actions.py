"""Admin actions at the edges: vanished messages, "select all" across pages, big selections.

Every message is made through the service. The only direct UPDATE moves leases into the
past (how tests expire a lease deterministically); the only delete is the service's purge.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.urls import reverse

from tests.support.admin import CHANGELIST, confirm_form, feedback
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService


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
    lease = service.claim_message(message_id)
    assert lease
    assert service.fail(message_id, lease.token, "boom")


def first_page_pks(queue: str) -> list[str]:
    """What the changelist's own form posts: the checkboxes of the rows on screen."""
    pks = Message.objects.filter(queue_name=queue).order_by("-id").values_list("pk", flat=True)[:50]
    return [str(pk) for pk in pks]


def purge_dead(queue: str) -> None:
    """The service's purge of ``queue``'s dead letters (their death moved a minute back first,
    so that ``older_than=0`` takes them whatever the clock's resolution)."""
    Message.objects.filter(queue_name=queue, status=Status.DEAD).update(
        dead_at=Now() - dt.timedelta(minutes=1)
    )
    assert ZeroLossMessageService(instance_id="purger").purge_messages(
        status=Status.DEAD, older_than=0, queue_name=queue
    )


def is_id_lookup(sql: str) -> bool:
    """The service's check that every selected id exists (its named statement KNOWN_IDS)."""
    from django.db import connection as conn

    from zeroloss.ledger.base import engine_for

    return sql == engine_for(conn).sql["KNOWN_IDS"]


@contextmanager
def purge_when_the_service_checks_ids(queue: str) -> Iterator[list[str]]:
    """Purge ``queue``'s dead letters at the exact moment the service looks the ids up.

    That is the race a real operator meets: the page and the selection were read, then a
    purge (``zeroloss_purge``, another operator) deletes a selected message before the
    action reaches it. The purge is the service's own, on the same database.
    """
    fired: list[str] = []

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if not fired and is_id_lookup(sql):
            fired.append(sql)
            purge_dead(queue)
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
            assert worker.claim_message("keep")
            assert worker.claim_message("gone")
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
            with purge_when_the_service_checks_ids("doomed") as purged:
                yield purged
            return
        # A live message is not purgeable: it is dead-lettered and purged in the race.
        fired: list[str] = []

        def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, ctx: Any) -> Any:
            if not fired and is_id_lookup(sql):
                fired.append(sql)
                other = ZeroLossMessageService(instance_id="other-operator")
                other.dead_letter_messages(["gone"], reason="race", actor="other")
                purge_dead("doomed")
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
    from benchmarks.db import analyze, load_messages
    from tests.conftest import database_url

    count = 70_500
    # One INSERT ... SELECT generate_series writing the rows and audit rows the service would:
    # processing messages whose leases expired a minute ago (a crashed worker's, stuck).
    with psycopg.connect(database_url(), autocommit=True) as conn:
        load_messages(conn, queue="bulk", prefix="bulk", count=count, state="expired")
        analyze(conn)  # what autovacuum does to a table this size
    ZeroLossMessageService().persist_message("bystander", "other", {})
    assert Message.objects.stuck().filter(queue_name="bulk").count() == count
    client = root_client()
    # "Select all 70500 messages" on the stuck list, then "Requeue stuck messages".
    response = client.post(
        reverse(CHANGELIST) + "?lease=stuck",
        {
            "action": "requeue_stuck",
            "select_across": "1",
            "index": "0",
            "_selected_action": first_page_pks("bulk"),
        },
    )
    html = feedback(client, response)
    assert f"{count} stuck messages were requeued." in html
    assert Message.objects.filter(queue_name="bulk", status=Status.PENDING).count() == count
    assert MessageEvent.objects.filter(reason="requeued_by_operator", actor="root").count() == count
    assert Message.objects.get(message_id="bystander").status == Status.PENDING


# -- (d) the confirmation page of a "select all" carries the filter, not the ids -------


@pytest.mark.parametrize("action", ["dead_letter", "force_requeue"])
def test_confirming_a_select_all_of_more_rows_than_post_fields(db: None, settings: Any, action: str) -> None:
    # Django reads the limit per request: a lower one shows the same thing with fewer rows.
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 100
    count = django_settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 200
    worker = ZeroLossMessageService(instance_id="bulk-worker", ack_timeout=600)
    persist(worker, "bulk", count, "bulk")
    persist(worker, "other", 3, "other")
    if action == "force_requeue":
        assert len(worker.claim("bulk", limit=count)) == count
        assert len(worker.claim("other", limit=3)) == 3
    client = root_client()
    url = reverse(CHANGELIST) + "?queue=bulk"
    response = client.post(
        url,
        {"action": action, "select_across": "1", "index": "0", "_selected_action": first_page_pks("bulk")},
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert f"{count} selected messages" in html
    form = confirm_form(html)
    data: dict[str, list[str]] = {}
    for name, value in form.fields:
        data.setdefault(name, []).append(value)
    if action == "dead_letter":
        data["reason"] = ["customer left"]
    confirmed = client.post(form.action or url, data)
    assert confirmed.status_code == 302, f"{confirmed.status_code} for a form of {len(form.fields)} fields"
    html = feedback(client, confirmed)
    assert len(form.fields) < 100, f"{len(form.fields)} hidden fields: the selection went out as ids"
    done = "were dead-lettered" if action == "dead_letter" else "were requeued; their leases were revoked"
    assert f"{count} messages {done}" in html
    moved_to = Status.DEAD if action == "dead_letter" else Status.PENDING
    assert Message.objects.filter(queue_name="bulk", status=moved_to).count() == count
    # The filter was carried: the other queue's messages were not selected.
    untouched = Status.PENDING if action == "dead_letter" else Status.PROCESSING
    assert set(Message.objects.filter(queue_name="other").values_list("status", flat=True)) == {untouched}


def test_confirmation_without_select_all_acts_only_on_the_chosen_rows(db: None) -> None:
    worker = ZeroLossMessageService(instance_id="w")
    persist(worker, "bulk", 5, "bulk")
    client = root_client()
    chosen = [str(Message.objects.get(message_id=m).pk) for m in ("bulk-1", "bulk-3")]
    response = client.post(
        reverse(CHANGELIST) + "?queue=bulk",
        {"action": "dead_letter", "select_across": "0", "index": "0", "_selected_action": chosen},
    )
    form = confirm_form(response.content.decode())
    data: dict[str, list[str]] = {"reason": ["two of them"]}
    for name, value in form.fields:
        data.setdefault(name, []).append(value)
    assert sorted(data["_selected_action"]) == sorted(chosen)
    html = feedback(client, client.post(form.action or reverse(CHANGELIST), data))
    assert "2 messages were dead-lettered." in html
    dead = set(Message.objects.filter(status=Status.DEAD).values_list("message_id", flat=True))
    assert dead == {"bulk-1", "bulk-3"}
