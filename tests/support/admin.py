"""The admin as its users drive it: users with given permissions, logged-in clients, the
confirmation pages' forms and the feedback after an action."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

from django.contrib.auth.models import Permission, User
from django.test import Client

CHANGELIST = "admin:zeroloss_message_changelist"


def make_user(username: str, *perms: str, staff: bool = True, superuser: bool = False) -> User:
    if superuser:
        user = User.objects.create_superuser(username, f"{username}@example.com", "pw")
    else:
        user = User.objects.create_user(username, password="pw", is_staff=staff)
    for codename in perms:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="zeroloss", codename=codename)
        )
    return user


def client_for(user: User | None, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    if user is not None:
        client.force_login(user)
    return client


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
