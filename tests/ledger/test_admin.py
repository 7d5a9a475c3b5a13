"""The operator's desk with Django's test client: permissions, CSRF, actions, XSS, query counts.

Every message is made through the service (stuck ones with a short ``ack_timeout`` and a
sleep); the admin itself must never write a message or an event row except through it.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.support import expire_leases
from tests.support.admin import CHANGELIST, client_for, make_user
from zeroloss import admin as zl_admin
from zeroloss.admin import paginator as zl_paginator
from zeroloss.ledger.models import Message, MessageEvent, PurgeRecord, ReplicationNode, Status
from zeroloss.ledger.service import Lease, ZeroLossMessageService
from zeroloss.ops import dashboard

#: A count per status, all zero (a status added later counts zero here too).
NONE = dict.fromkeys(Status.values, 0)

ACTION_PERMS = {
    "requeue_stuck": "requeue_message",
    "force_requeue": "force_requeue_message",
    "redrive": "redrive_message",
    "dead_letter": "deadletter_message",
    "purge_completed": "purge_message",
}
XSS_SCRIPT = "<script>alert('payload')</script>"
XSS_ERROR = '<img src=x onerror="alert(1)">'


@dataclass
class Ledger:
    live_lease: Lease
    worker: ZeroLossMessageService


def status(message_id: str) -> str:
    return Message.objects.get(message_id=message_id).status


def last_event(message_id: str) -> MessageEvent:
    return MessageEvent.objects.for_message(message_id).last()  # type: ignore[return-value]


@pytest.fixture(autouse=True)
def _fresh_cache_and_retention(settings: Any) -> None:
    cache.clear()
    settings.ZEROLOSS = {**settings.ZEROLOSS, "COMPLETED_RETENTION": 0.1}


@pytest.fixture
def ledger(db: None) -> Ledger:
    """p1 pending, s1 stuck, l1 under a live lease, d1 dead, c1 completed (older than retention)."""
    worker = ZeroLossMessageService(instance_id="worker-1")
    short = ZeroLossMessageService(instance_id="worker-stuck")
    long = ZeroLossMessageService(instance_id="worker-live", ack_timeout=600)
    worker.persist_message("p1", "emails", {"n": 1})
    short.persist_message("s1", "emails", {"n": 2})
    assert short.claim_message("s1")
    long.persist_message("l1", "sms", {"n": 3})
    live = long.claim_message("l1")
    assert live
    worker.persist_message("d1", "emails", {"n": 4}, max_attempts=1)
    lease = worker.claim_message("d1")
    assert lease
    assert worker.fail("d1", lease.token, "boom")
    worker.persist_message("c1", "emails", {"n": 5})
    lease = worker.claim_message("c1")
    assert lease
    assert worker.acknowledge("c1", lease.token)
    assert expire_leases(["s1"]) == 1  # s1's worker died: its lease ran out
    # c1 finished a minute ago: older than the retention (the database's clock, not a sleep).
    Message.objects.filter(message_id="c1").update(completed_at=Now() - dt.timedelta(seconds=60))
    assert set(Message.objects.stuck().values_list("message_id", flat=True)) == {"s1"}
    return Ledger(live_lease=live, worker=long)


def post_action(client: Client, action: str, *message_ids: str, **extra: str) -> Any:
    pks = [str(pk) for pk in Message.objects.filter(message_id__in=message_ids).values_list("pk", flat=True)]
    data: dict[str, Any] = {"action": action, "_selected_action": pks, "index": "0", **extra}
    return client.post(reverse(CHANGELIST), data)


def pk(message_id: str) -> int:
    return Message.objects.get(message_id=message_id).pk


USERS = ["anonymous", "staff", "viewer", *ACTION_PERMS.values(), "superuser"]


def user_for(kind: str) -> User | None:
    if kind == "anonymous":
        return None
    if kind == "staff":
        return make_user("staff")
    if kind == "viewer":
        return make_user("viewer", "view_message")
    if kind == "superuser":
        return make_user("root", superuser=True)
    return make_user(f"op-{kind}", kind)


# -- pages ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", USERS)
def test_page_permission_matrix(ledger: Ledger, kind: str) -> None:
    user = user_for(kind)
    client = client_for(user)
    allowed_view = kind not in ("anonymous", "staff")
    pages = {
        "changelist": (reverse(CHANGELIST), allowed_view),
        "stuck filter": (reverse(CHANGELIST) + "?lease=stuck", allowed_view),
        "detail": (reverse("admin:zeroloss_message_change", args=[pk("l1")]), allowed_view),
        "dashboard": (reverse("admin:zeroloss_message_dashboard"), allowed_view),
        "purge page": (reverse("admin:zeroloss_message_purge"), kind in ("purge_message", "superuser")),
        "nodes": (reverse("admin:zeroloss_replicationnode_changelist"), kind == "superuser"),
        "events": (reverse("admin:zeroloss_messageevent_changelist"), kind == "superuser"),
        "purge records": (reverse("admin:zeroloss_purgerecord_changelist"), kind == "superuser"),
    }
    for name, (url, allowed) in pages.items():
        response = client.get(url)
        if user is None:
            assert response.status_code == 302, name
            assert "/login/" in response["Location"], name
        elif allowed:
            assert response.status_code == 200, (name, response.status_code)
        else:
            assert response.status_code == 403, (name, response.status_code)
    # The add and delete pages never exist for anybody.
    for url in (
        reverse("admin:zeroloss_message_add"),
        reverse("admin:zeroloss_message_delete", args=[pk("p1")]),
    ):
        response = client.get(url)
        assert response.status_code in (302, 403), url
    # The detail page is read-only: a POST to it changes nothing.
    if user is not None and allowed_view:
        response = client.post(
            reverse("admin:zeroloss_message_change", args=[pk("p1")]), {"status": "completed"}
        )
        assert response.status_code == 403
        assert status("p1") == Status.PENDING


@pytest.mark.parametrize("kind", USERS)
def test_app_index_links_the_dashboard(ledger: Ledger, kind: str) -> None:
    user = user_for(kind)
    client = client_for(user)
    response = client.get(reverse("admin:app_list", args=["zeroloss"]))
    if user is None:
        assert response.status_code == 302
        return
    if kind == "staff":
        assert response.status_code == 404  # Django's answer for an app the user cannot see
        return
    assert response.status_code == 200
    assert reverse("admin:zeroloss_message_dashboard") in response.content.decode()
    index = client.get(reverse("admin:index")).content.decode()
    assert reverse("admin:zeroloss_message_dashboard") in index


# -- actions --------------------------------------------------------------------------


def perform(client: Client, action: str) -> Any:
    """Run ``action`` on its natural target, confirming intermediate pages."""
    if action == "requeue_stuck":
        return post_action(client, action, "s1")
    if action == "force_requeue":
        return post_action(client, action, "l1", post="yes")
    if action == "redrive":
        return post_action(client, action, "d1")
    if action == "dead_letter":
        return post_action(client, action, "p1", post="yes", reason="bad address")
    return post_action(client, action, "c1", post="yes")


def effect_visible(action: str, actor: str) -> bool:
    if action == "purge_completed":
        gone = not Message.objects.filter(message_id="c1").exists()
        if gone:
            assert PurgeRecord.objects.get(status="completed").actor == actor
        return gone
    target, expected, reason = {
        "requeue_stuck": ("s1", Status.PENDING, "requeued_by_operator"),
        "force_requeue": ("l1", Status.PENDING, "requeued_by_operator"),
        "redrive": ("d1", Status.PENDING, "redriven_by_operator"),
        "dead_letter": ("p1", Status.DEAD, "dead_lettered_by_operator"),
    }[action]
    if status(target) != expected:
        return False
    event = last_event(target)
    assert (event.reason, event.actor) == (reason, actor)
    return True


@pytest.mark.parametrize("kind", USERS)
@pytest.mark.parametrize("action", list(ACTION_PERMS))
def test_action_permission_matrix(ledger: Ledger, kind: str, action: str) -> None:
    user = user_for(kind)
    client = client_for(user)
    events_before = MessageEvent.objects.count()
    response = perform(client, action)
    allowed = kind == "superuser" or ACTION_PERMS[action] == kind
    if user is None:
        assert response.status_code == 302
        assert "/login/" in response["Location"]
    elif allowed:
        assert response.status_code == 302, response.content[:500]
    else:
        # A POSTed action this user is not offered is refused outright (not Django's quiet
        # "No action selected"), whether the user has no zeroloss permission or another one.
        assert response.status_code == 403, response.content[:500]
    if allowed:
        assert user is not None
        assert effect_visible(action, user.get_username())
    else:
        assert not effect_visible(action, "nobody")
        assert MessageEvent.objects.count() == events_before
        assert Message.objects.count() == 5


def test_actions_offered_match_permissions(ledger: Ledger) -> None:
    for codename in ACTION_PERMS.values():
        client = client_for(make_user(f"u-{codename}", codename))
        html = client.get(reverse(CHANGELIST)).content.decode()
        offered = set(re.findall(r'<option value="([a-z_]+)"', html)) & set(ACTION_PERMS)
        assert offered == {a for a, p in ACTION_PERMS.items() if p == codename}
    html = client_for(make_user("root", superuser=True)).get(reverse(CHANGELIST)).content.decode()
    assert set(ACTION_PERMS) <= set(re.findall(r'<option value="([a-z_]+)"', html))
    assert "delete_selected" not in html


def test_csrf_is_enforced_on_actions(ledger: Ledger) -> None:
    root = make_user("root", superuser=True)
    client = client_for(root, enforce_csrf_checks=True)
    for action in ACTION_PERMS:
        response = perform(client, action)
        assert response.status_code == 403, action
    assert MessageEvent.objects.filter(actor="root").count() == 0
    assert Message.objects.count() == 5
    response = client.post(reverse("admin:zeroloss_message_purge"))
    assert response.status_code == 403
    assert Message.objects.filter(message_id="c1").exists()
    # With the token from the changelist, the same request goes through.
    client.get(reverse(CHANGELIST))
    token = client.cookies["csrftoken"].value
    response = post_action(client, "requeue_stuck", "s1", csrfmiddlewaretoken=token)
    assert response.status_code == 302
    assert status("s1") == Status.PENDING


def test_requeue_reports_plural_feedback_and_leaves_live_leases_alone(ledger: Ledger) -> None:
    short = ZeroLossMessageService(instance_id="worker-stuck-2")
    short.persist_message("s2", "emails", {"n": 6})
    assert short.claim_message("s2")
    assert expire_leases(["s2"]) == 1
    client = client_for(make_user("op", "requeue_message"))
    response = post_action(client, "requeue_stuck", "s1", "s2", "l1")
    html = client.get(response["Location"]).content.decode()
    assert "2 stuck messages were requeued." in html
    assert "1 selected message was left alone" in html
    assert status("l1") == Status.PROCESSING
    assert [e.reason for e in MessageEvent.objects.for_message("s1")].count("requeued_by_operator") == 1
    # Exactly once: a second requeue of the same messages moves nothing.
    response = post_action(client, "requeue_stuck", "s1", "s2")
    html = client.get(response["Location"]).content.decode()
    assert "2 selected messages were left alone" in html
    assert [e.reason for e in MessageEvent.objects.for_message("s1")].count("requeued_by_operator") == 1


def test_force_requeue_confirms_first_and_fences_the_old_worker(ledger: Ledger) -> None:
    client = client_for(make_user("op", "force_requeue_message"))
    response = post_action(client, "force_requeue", "l1")
    assert response.status_code == 200
    html = response.content.decode()
    assert "The running worker will lose its lease." in html
    assert "acknowledgement will be refused" in html
    assert "worker-live" in html
    assert 'name="post" value="yes"' in html
    assert status("l1") == Status.PROCESSING  # nothing happened yet
    response = post_action(client, "force_requeue", "l1", post="yes")
    assert response.status_code == 302
    assert status("l1") == Status.PENDING
    event = last_event("l1")
    assert (event.reason, event.actor, event.detail) == (
        "requeued_by_operator",
        "op",
        "live lease revoked by operator",
    )
    # Fencing: the worker that held the lease can no longer acknowledge.
    assert ledger.worker.acknowledge("l1", ledger.live_lease.token) is False
    assert status("l1") == Status.PENDING


def test_force_requeue_of_no_live_lease_shows_no_red_warning(ledger: Ledger) -> None:
    client = client_for(make_user("op", "force_requeue_message"))
    html = post_action(client, "force_requeue", "s1").content.decode()  # processing, its lease expired
    assert "No selected message is held under a live lease: no running worker loses its lease." in html
    assert "1 selected message is processing and will be requeued" in html
    assert "zl-warning" not in html and 'role="alert"' not in html and "zl-danger" not in html
    assert "The running worker will lose its lease." not in html
    assert "Requeue the selected messages?" in html and "Yes, requeue" in html
    live = post_action(client, "force_requeue", "s1", "l1").content.decode()
    assert 'class="zl-warning" role="alert"' in live and "zl-danger" in live
    assert "1 selected message is held under a live lease right now." in live


def test_dead_letter_asks_for_a_reason(ledger: Ledger) -> None:
    client = client_for(make_user("op", "deadletter_message"))
    response = post_action(client, "dead_letter", "p1", "l1")
    assert response.status_code == 200
    assert 'name="reason"' in response.content.decode()
    assert "will lose the lease" in response.content.decode()
    response = post_action(client, "dead_letter", "p1", post="yes", reason="   ")
    assert response.status_code == 200
    assert "This field is required." in response.content.decode()
    assert status("p1") == Status.PENDING
    response = post_action(client, "dead_letter", "p1", "c1", post="yes", reason="customer asked us to stop")
    assert response.status_code == 302
    html = client.get(response["Location"]).content.decode()
    assert "1 message was dead-lettered." in html
    assert "1 selected message was left alone" in html
    message = Message.objects.get(message_id="p1")
    assert (message.status, message.last_error) == (Status.DEAD, "customer asked us to stop")
    event = last_event("p1")
    assert (event.reason, event.actor, event.detail) == (
        "dead_lettered_by_operator",
        "op",
        "customer asked us to stop",
    )


def test_redrive_resets_attempts(ledger: Ledger) -> None:
    client = client_for(make_user("op", "redrive_message"))
    response = post_action(client, "redrive", "d1", "p1")
    html = client.get(response["Location"]).content.decode()
    assert "1 dead letter was redriven to pending (attempts reset)." in html
    message = Message.objects.get(message_id="d1")
    assert (message.status, message.attempts) == (Status.PENDING, 0)


def test_purge_page_confirms_then_purges(ledger: Ledger) -> None:
    client = client_for(make_user("op", "purge_message"))
    url = reverse("admin:zeroloss_message_purge")
    response = client.get(url)
    assert response.status_code == 200
    assert "1 message" in response.content.decode()
    assert Message.objects.filter(message_id="c1").exists()
    response = client.post(url)
    assert response.status_code == 302
    html = client.get(response["Location"]).content.decode()
    assert "1 completed message older than" in html
    assert not Message.objects.filter(message_id="c1").exists()
    assert MessageEvent.objects.filter(message__message_id="c1").count() == 0
    record = PurgeRecord.objects.get()
    assert (record.actor, record.count, record.queue_name) == ("op", 1, "emails")
    assert Message.objects.count() == 4


def test_purge_action_confirms_first(ledger: Ledger) -> None:
    client = client_for(make_user("op", "purge_message"))
    response = post_action(client, "purge_completed", "c1")
    assert response.status_code == 200
    assert "Yes, purge them" in response.content.decode()
    assert Message.objects.filter(message_id="c1").exists()


def test_action_on_a_purged_message_reports_it(ledger: Ledger) -> None:
    client = client_for(make_user("root", superuser=True))
    pks = [str(pk("d1"))]
    ZeroLossMessageService().purge_messages(status="dead", older_than=0)
    response = client.post(reverse(CHANGELIST), {"action": "redrive", "_selected_action": pks, "index": "0"})
    assert response.status_code == 302
    html = client.get(response["Location"]).content.decode()
    assert "None of the selected messages exists any more" in html
    assert not Message.objects.filter(message_id="d1").exists()
    assert not MessageEvent.objects.filter(actor="root").exists()


# -- pages show the truth -------------------------------------------------------------


def test_changelist_columns_and_filters(ledger: Ledger) -> None:
    client = client_for(make_user("root", superuser=True))
    html = client.get(reverse(CHANGELIST)).content.decode()
    for text in ("expired (stuck)", "overdue", "left", "worker-live", "1 / 1", "boom"):
        assert text in html, text
    stuck = client.get(reverse(CHANGELIST) + "?lease=stuck").content.decode()
    assert ">s1<" in stuck
    assert ">l1<" not in stuck
    assert ">p1<" not in stuck
    live = client.get(reverse(CHANGELIST) + "?lease=live").content.decode()
    assert ">l1<" in live
    assert ">s1<" not in live
    by_queue = client.get(reverse(CHANGELIST) + "?queue=sms").content.decode()
    assert ">l1<" in by_queue
    assert ">p1<" not in by_queue
    dead = client.get(reverse(CHANGELIST) + "?status__exact=dead").content.decode()
    assert ">d1<" in dead
    assert ">p1<" not in dead
    found = client.get(reverse(CHANGELIST) + "?q=error:boom").content.decode()
    assert ">d1<" in found
    assert ">p1<" not in found
    assert ">p1<" in client.get(reverse(CHANGELIST) + "?q=p1").content.decode()
    today = client.get(reverse(CHANGELIST) + "?created_at__gte=2000-01-01T00:00:00%2B00:00").content.decode()
    assert ">p1<" in today


def test_detail_page_shows_integrity_lease_and_audit_trail(ledger: Ledger) -> None:
    client = client_for(make_user("viewer", "view_message"))
    html = client.get(reverse("admin:zeroloss_message_change", args=[pk("d1")])).content.decode()
    assert Message.objects.get(message_id="d1").checksum in html
    assert "valid" in html
    for reason in ("persisted", "claimed", "dead_lettered"):
        assert f"<td>{reason}</td>" in html
    assert "&quot;n&quot;: 4" in html  # pretty-printed JSON, escaped
    # A viewer gets no action buttons; an operator gets only theirs.
    assert "Act on this message" not in html
    op = client_for(make_user("op", "redrive_message"))
    html = op.get(reverse("admin:zeroloss_message_change", args=[pk("d1")])).content.decode()
    assert 'value="redrive"' in html
    assert 'value="requeue_stuck"' not in html
    stuck = client.get(reverse("admin:zeroloss_message_change", args=[pk("s1")])).content.decode()
    assert "Stuck in processing" in stuck
    # Only the actions that apply to the message's state are offered on its page.
    root = client_for(make_user("root", superuser=True))
    offered = {
        mid: set(
            re.findall(
                r'name="action" value="([a-z_]+)"',
                root.get(reverse("admin:zeroloss_message_change", args=[pk(mid)])).content.decode(),
            )
        )
        for mid in ("p1", "s1", "l1", "d1", "c1")
    }
    assert offered == {
        "p1": {"dead_letter"},
        "s1": {"requeue_stuck", "force_requeue", "dead_letter"},
        "l1": {"force_requeue", "dead_letter"},
        "d1": {"redrive"},
        "c1": set(),
    }


def test_dashboard_numbers(ledger: Ledger) -> None:
    ZeroLossMessageService().register_replication_node("node-a", "10.0.0.1", role="standby")
    client = client_for(make_user("viewer", "view_message"))
    response = client.get(reverse("admin:zeroloss_message_dashboard"))
    html = response.content.decode()
    assert 'http-equiv="refresh"' in html
    assert "<svg" in html
    assert "<script" not in html.split('id="content"')[1]  # no JS needed, nothing from a CDN
    data = response.context["data"]
    assert data.total == 5
    assert data.stuck == 1
    assert data.dead == 1
    assert data.chart.completed_total == 1
    assert data.chart.persisted_total == 5
    by_queue = {q.name: dict(zip(data.statuses, q.counts, strict=True)) for q in data.queues}
    assert by_queue["emails"] == NONE | {"pending": 1, "processing": 1, "completed": 1, "dead": 1}
    assert by_queue["sms"]["processing"] == 1
    assert [n.node_id for n in data.nodes] == ["node-a"]
    assert data.nodes[0].live
    assert data.integrity.stuck == 1
    assert not data.integrity.checksum_mismatches
    assert "node-a" in html


def test_dashboard_is_cached_for_cache_timeout(ledger: Ledger, settings: Any) -> None:
    settings.ZEROLOSS = {**settings.ZEROLOSS, "CACHE_TIMEOUT": 60}
    client = client_for(make_user("root", superuser=True))
    url = reverse("admin:zeroloss_message_dashboard")
    assert client.get(url).context["data"].total == 5
    ZeroLossMessageService().persist_message("later", "emails", {})
    assert client.get(url).context["data"].total == 5
    assert client.get(url + "?refresh=1").context["data"].total == 6
    settings.ZEROLOSS = {**settings.ZEROLOSS, "CACHE_TIMEOUT": 0}
    ZeroLossMessageService().persist_message("later-2", "emails", {})
    assert client.get(url).context["data"].total == 7


def test_dashboard_integrity_flags_a_tampered_checksum(ledger: Ledger) -> None:
    # Tampering is the point of this test, so it writes the row directly.
    Message.objects.filter(message_id="p1").update(checksum="0" * 64)
    data = dashboard.collect(ZeroLossMessageService())
    assert data.integrity.checksum_mismatches == ["p1"]
    assert not data.integrity.ok
    client = client_for(make_user("root", superuser=True))
    html = client.get(reverse("admin:zeroloss_message_change", args=[pk("p1")])).content.decode()
    assert "Checksum mismatch" in html


def test_replication_nodes_page(ledger: Ledger) -> None:
    service = ZeroLossMessageService()
    service.register_replication_node("node-live", "10.0.0.2", role="standby")
    service.register_replication_node("node-gone", "10.0.0.3")
    ReplicationNode.objects.filter(node_id="node-gone").update(last_seen_at="2000-01-01T00:00:00Z")
    client = client_for(make_user("root", superuser=True))
    html = client.get(reverse("admin:zeroloss_replicationnode_changelist")).content.decode()
    assert re.search(r"node-live.*?zl-live", html, re.S)
    assert re.search(r"node-gone.*?>down<", html, re.S)
    assert "Replication requirement" in html
    assert ">met<" in html  # REPLICATION_FACTOR 1 with durable persistence needs no standby


# -- XSS ------------------------------------------------------------------------------


def test_markup_in_payload_error_and_ids_renders_inert_everywhere(ledger: Ledger) -> None:
    worker = ZeroLossMessageService(instance_id="<b>evil-worker</b>")
    evil_id = "<svg onload=alert(3)>"
    worker.persist_message(evil_id, "emails", {"html": XSS_SCRIPT, "<k>": "</pre><script>x</script>"})
    lease = worker.claim_message(evil_id)
    assert lease
    assert worker.fail(evil_id, lease.token, XSS_ERROR)
    evil_pk = pk(evil_id)
    root = client_for(make_user("root", superuser=True))
    pages = [
        reverse(CHANGELIST),
        reverse(CHANGELIST) + "?q=error:onerror",
        reverse("admin:zeroloss_message_change", args=[evil_pk]),
        reverse("admin:zeroloss_message_dashboard"),
        reverse("admin:zeroloss_messageevent_changelist"),
        reverse("admin:zeroloss_message_purge"),
    ]
    bodies = [root.get(url).content.decode() for url in pages]
    pks = [str(evil_pk)]
    for action in ("force_requeue", "dead_letter", "purge_completed"):
        response = root.post(reverse(CHANGELIST), {"action": action, "_selected_action": pks, "index": "0"})
        assert response.status_code == 200
        bodies.append(response.content.decode())
    ZeroLossMessageService().dead_letter_messages([evil_id], reason=XSS_ERROR, actor="<i>op</i>")
    bodies.append(root.get(reverse("admin:zeroloss_message_change", args=[evil_pk])).content.decode())
    for body in bodies:
        for raw in (XSS_SCRIPT, XSS_ERROR, "<script>x</script>", evil_id, "<b>evil-worker</b>", "<i>op</i>"):
            assert raw not in body
    detail = bodies[2]
    assert "&lt;script&gt;alert(" in detail
    assert "&lt;img src=x onerror=" in detail
    assert "&lt;svg onload=alert(3)&gt;" in detail
    assert "&lt;b&gt;evil-worker&lt;/b&gt;" in detail


# -- speed at scale -------------------------------------------------------------------


def test_changelist_query_count_does_not_grow_with_rows(ledger: Ledger) -> None:
    client = client_for(make_user("root", superuser=True))
    url = reverse(CHANGELIST)
    client.get(url)
    with CaptureQueriesContext(connection) as few:
        assert client.get(url).status_code == 200
    ZeroLossMessageService().persist_messages([(f"bulk-{i}", "bulk", {"i": i}) for i in range(40)])
    with CaptureQueriesContext(connection) as many:
        assert client.get(url).status_code == 200
    assert len(many.captured_queries) == len(few.captured_queries)
    # The page never selects the payload column, and never counts the whole table unbounded.
    listing = [q["sql"] for q in many.captured_queries if "zeroloss_message" in q["sql"]]
    assert not any('"payload"' in sql and "ORDER BY" in sql for sql in listing)
    assert not any(re.search(r"COUNT\(\*\)[^(]*FROM \"zeroloss_message\"\s*$", sql) for sql in listing)


@pytest.mark.postgres_only
def test_unfiltered_changelist_uses_the_planner_estimate_on_postgres(
    ledger: Ledger, monkeypatch: Any
) -> None:
    ZeroLossMessageService().persist_messages([(f"bulk-{i}", "bulk", {"i": i}) for i in range(60)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE zeroloss_message")
    monkeypatch.setattr(zl_paginator, "ESTIMATE_ABOVE", 10)
    client = client_for(make_user("root", superuser=True))
    with CaptureQueriesContext(connection) as queries:
        assert client.get(reverse(CHANGELIST)).status_code == 200
    sql = [q["sql"] for q in queries.captured_queries]
    assert any("reltuples" in s for s in sql)
    assert not any("COUNT(" in s.upper() and "zeroloss_message" in s for s in sql)
    # Filtered, it counts, but never more than COUNT_CAP rows.
    monkeypatch.setattr(zl_paginator, "COUNT_CAP", 5)
    with CaptureQueriesContext(connection) as queries:
        html = client.get(reverse(CHANGELIST) + "?queue=bulk").content.decode()
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts
    assert all("LIMIT 6" in s for s in counts)
    assert "bulk-59" in html


def test_paginator_caps_filtered_counts(ledger: Ledger, monkeypatch: Any) -> None:
    monkeypatch.setattr(zl_paginator, "COUNT_CAP", 3)
    paginator = zl_admin.LedgerPaginator(Message.objects.filter(queue_name="emails").order_by("id"), 2)
    assert paginator.count == 3
    assert paginator.capped
    paginator = zl_admin.LedgerPaginator(Message.objects.filter(queue_name="sms").order_by("id"), 2)
    assert paginator.count == 1
    assert not paginator.capped


def test_format_helpers() -> None:
    assert dashboard.format_lsn(None) == ""  # the admin shows "-" for a missing position
    assert dashboard.format_lsn((0x16 << 32) + 0xB374D848) == "16/B374D848"
    assert dashboard.format_duration(None) == "-"
    assert dashboard.format_duration(3.25) == "3.2s"
    assert dashboard.format_duration(42) == "42s"
    assert dashboard.format_duration(185) == "3m 05s"
    assert dashboard.format_duration(7620) == "2h 07m"
    assert dashboard.format_duration(4 * 86400 + 3 * 3600) == "4d 03h"
    assert dashboard.format_duration(-90) == "-1m 30s"
