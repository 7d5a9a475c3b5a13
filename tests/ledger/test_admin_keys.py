"""The admin's *Blocked keys* page and the actions on a key's head; the changelist's ordering
columns, filters and ``key:`` search. Real database, real service, Django's test client."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from tests.support import expire_leases
from tests.support.admin import client_for, make_user
from tests.support.factories import blocked_ledger
from zeroloss.ledger.models import Message, MessageEvent, Status

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = "admin:zeroloss_message_blocked_keys"
CHANGELIST = "admin:zeroloss_message_changelist"


@pytest.fixture(autouse=True)
def _ledger() -> None:
    cache.clear()
    blocked_ledger()


def pk(message_id: str) -> int:
    return Message.objects.get(message_id=message_id).pk


def post_key_action(client: Client, action: str, message_id: str, query: str = "", **extra: str) -> Any:
    data = {"action": action, "_selected_action": [str(pk(message_id))], **extra}
    return client.post(reverse(PAGE) + query, data)


def head_of(queue: str, key: str) -> str:
    return Message.objects.get(
        queue_name=queue, ordering_key=key, status__in=["pending", "processing"], available_at__isnull=False
    ).message_id


def rows(html: str) -> list[list[str]]:
    """The page's table as text cells."""
    body = html.split('id="zl-blocked-keys"', 1)[1].split("</table>", 1)[0]
    return [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", body.split("<tbody>", 1)[1], re.S)
    ]


def test_page_lists_blocked_keys_with_why_since_and_waiting() -> None:
    client = client_for(make_user("viewer", "view_message"))
    response = client.get(reverse(PAGE))
    assert response.status_code == 200
    html = response.content.decode()
    table = {(r[0], r[1]): r for r in rows(html)}
    assert set(table) == {("q", "busy"), ("q", "failing"), ("other", "busy")}
    busy, failing = table["q", "busy"], table["q", "failing"]
    assert busy[2:5] == ["b0", "processing", "processing"]
    assert busy[6] == "3" and "processing by worker-1" in busy[7]
    assert failing[2:5] == ["f0", "pending", "retry_backoff"]
    assert failing[6] == "2" and "upstream said 503" in failing[7]
    assert reverse("admin:zeroloss_message_change", args=[pk("b0")]) in html
    # A viewer sees no buttons.
    assert 'value="skip_key_head"' not in html and 'value="requeue_key_head"' not in html
    # The changelist links the page.
    changelist = client.get(reverse(CHANGELIST)).content.decode()
    assert reverse(PAGE) in changelist


def test_queue_parameter() -> None:
    client = client_for(make_user("viewer", "view_message"))
    html = client.get(reverse(PAGE) + "?queue=other").content.decode()
    assert [(r[0], r[1]) for r in rows(html)] == [("other", "busy")]
    assert "No ordering key is blocked." in client.get(reverse(PAGE) + "?queue=nothing").content.decode()
    assert client.get(reverse(PAGE) + "?queue=bad%20queue!").status_code == 400
    assert client.get(reverse(PAGE) + "?queue=" + "x" * 101).status_code == 400


def test_page_needs_view_permission() -> None:
    assert client_for(make_user("staff")).get(reverse(PAGE)).status_code == 403
    anonymous = Client().get(reverse(PAGE))
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


def test_skip_asks_for_a_reason_then_moves_the_key_on_audited() -> None:
    client = client_for(make_user("op", "deadletter_message"))
    html = client.get(reverse(PAGE)).content.decode()
    assert 'value="skip_key_head"' in html
    assert 'value="requeue_key_head"' not in html  # no requeue permission
    response = post_key_action(client, "skip_key_head", "b0")
    assert response.status_code == 200
    page = response.content.decode()
    assert 'name="reason"' in page and "will lose the lease" in page
    response = post_key_action(client, "skip_key_head", "b0", post="yes", reason="   ")
    assert response.status_code == 200 and "This field is required." in response.content.decode()
    assert Message.objects.get(message_id="b0").status == Status.PROCESSING
    response = post_key_action(client, "skip_key_head", "b0", "?queue=q", post="yes", reason="poison payload")
    assert response.status_code == 302 and response["Location"] == reverse(PAGE) + "?queue=q"
    after = client.get(response["Location"]).content.decode()
    assert "1 key head was skipped (dead-lettered): its key moves on." in after
    b0 = Message.objects.get(message_id="b0")
    assert (b0.status, b0.last_error) == (Status.DEAD, "key skipped: poison payload")
    event = MessageEvent.objects.for_message("b0").last()
    assert event is not None
    assert (event.reason, event.actor, event.detail) == (
        "dead_lettered_by_operator",
        "op",
        "key skipped: poison payload",
    )
    assert head_of("q", "busy") == "b1"
    assert ("q", "busy") not in {(r[0], r[1]) for r in rows(after)}


def test_skip_of_a_message_that_is_no_longer_the_head_changes_nothing() -> None:
    client = client_for(make_user("op", "deadletter_message"))
    before = MessageEvent.objects.count()
    response = post_key_action(client, "skip_key_head", "b1", post="yes", reason="stale page")
    after = client.get(response["Location"]).content.decode()
    assert "1 selected message was left alone: not the head of an ordering key (any more)." in after
    assert MessageEvent.objects.count() == before
    assert Message.objects.get(message_id="b1").status == Status.PENDING


def test_requeue_a_stuck_head() -> None:
    client = client_for(make_user("op", "requeue_message"))
    html = client.get(reverse(PAGE)).content.decode()
    assert 'value="requeue_key_head"' not in html  # b0's lease is live
    expire_leases(["b0"])
    html = client.get(reverse(PAGE)).content.decode()
    assert html.count('value="requeue_key_head"') == 1
    assert 'value="skip_key_head"' not in html  # no dead-letter permission
    response = post_key_action(client, "requeue_key_head", "b0")
    assert response.status_code == 302
    assert (
        "1 stuck key head was requeued; it stays first in its key."
        in client.get(response["Location"]).content.decode()
    )
    b0 = Message.objects.get(message_id="b0")
    assert (b0.status, b0.attempts) == (Status.PENDING, 0)
    event = MessageEvent.objects.for_message("b0").last()
    assert event is not None and (event.reason, event.actor) == ("requeued_by_operator", "op")
    assert head_of("q", "busy") == "b0"


def test_requeue_leaves_a_live_or_backoff_head_alone() -> None:
    client = client_for(make_user("op", "requeue_message"))
    before = MessageEvent.objects.count()
    for mid in ("b0", "f0"):
        html = client.get(post_key_action(client, "requeue_key_head", mid)["Location"]).content.decode()
        assert "1 selected message was left alone: not a stuck key head" in html
    assert MessageEvent.objects.count() == before


@pytest.mark.parametrize(
    ("perm", "action"),
    [
        ("", "skip_key_head"),
        ("requeue_message", "skip_key_head"),
        ("", "requeue_key_head"),
        ("deadletter_message", "requeue_key_head"),
    ],
)
def test_actions_are_refused_without_their_permission(perm: str, action: str) -> None:
    expire_leases(["b0"])
    user = make_user("op", "view_message", *([perm] if perm else []))
    before = MessageEvent.objects.count()
    response = post_key_action(client_for(user), action, "b0", post="yes", reason="nope")
    assert response.status_code == 403
    assert MessageEvent.objects.count() == before
    assert Message.objects.get(message_id="b0").status == Status.PROCESSING


def test_forged_posts_are_bad_requests() -> None:
    client = client_for(make_user("root", superuser=True))
    before = MessageEvent.objects.count()
    assert post_key_action(client, "purge_completed", "b0", post="yes").status_code == 400
    assert post_key_action(client, "nothing", "b0").status_code == 400
    bad_pk = client.post(reverse(PAGE), {"action": "skip_key_head", "_selected_action": ["1 OR 1=1"]})
    assert bad_pk.status_code == 400
    assert client.post(reverse(PAGE), {"action": "skip_key_head"}).status_code == 400
    assert MessageEvent.objects.count() == before


def test_superuser_sees_both_buttons_where_they_apply() -> None:
    expire_leases(["b0"])
    html = client_for(make_user("root", superuser=True)).get(reverse(PAGE)).content.decode()
    assert html.count('value="skip_key_head"') == 3
    assert html.count('value="requeue_key_head"') == 1


# -- the changelist ---------------------------------------------------------------------


def listed(client: Client, query: str) -> set[str]:
    html = client.get(reverse(CHANGELIST) + query).content.decode()
    return set(re.findall(r'<span class="zl-line" title="[^"]*">([a-z]\d)</span>', html))


def test_changelist_ordering_columns_filters_and_key_search() -> None:
    Message.objects.filter(message_id="r1").update(priority=5)  # a read-only column here
    client = client_for(make_user("root", superuser=True))
    html = client.get(reverse(CHANGELIST)).content.decode()
    assert "column-key_column" in html and "column-priority_column" in html
    assert "(waiting for its key)" in html
    assert listed(client, "?ordering=head") == {"b0", "f0", "r0", "a0", "o0"}
    assert listed(client, "?ordering=behind") == {"b1", "b2", "b3", "f1", "f2", "r1", "o1"}
    assert listed(client, "?priority=high") == {"r1"}
    assert "r1" not in listed(client, "?priority=normal")
    assert listed(client, "?priority=low") == set()
    assert listed(client, "?q=key:busy") == {"b0", "b1", "b2", "b3", "o0", "o1"}
    assert listed(client, "?q=key:busy&queue=other") == {"o0", "o1"}
    assert listed(client, "?q=key:") == set()


def test_key_actions_on_the_changelist_and_the_detail_page() -> None:
    client = client_for(make_user("root", superuser=True))
    detail = client.get(reverse("admin:zeroloss_message_change", args=[pk("f0")])).content.decode()
    assert "skip_key_head" in detail and "requeue_key_head" not in detail
    data = {
        "action": "skip_key_head",
        "_selected_action": [str(pk("f0")), str(pk("b1"))],
        "post": "yes",
        "index": "0",
    }
    response = client.post(reverse(CHANGELIST), {**data, "reason": "given up"})
    assert response.status_code == 302
    html = client.get(response["Location"]).content.decode()
    assert "1 key head was skipped" in html and "1 selected message was left alone" in html
    assert Message.objects.get(message_id="f0").status == Status.DEAD
    assert head_of("q", "failing") == "f1"
    assert Message.objects.get(message_id="b1").status == Status.PENDING  # not its key's head


def test_dashboard_card_links_the_page() -> None:
    html = client_for(make_user("viewer", "view_message")).get(reverse("admin:zeroloss_message_dashboard"))
    card = re.search(
        r'<a class="zl-card[^"]*" id="zl-blocked-keys" href="([^"]+)"><span class="zl-card-value">(\S+)</span>',
        html.content.decode(),
    )
    assert card is not None and card.groups() == (reverse(PAGE), "3")
