"""The operator's desk speaks German and French: the changelist, a message's page and the dashboard
render fully translated under ``LANGUAGE_CODE = "de"`` and ``"fr"`` (Django's test client).

"Fully" is checked two ways: phrases each page must show in the language, and every English
phrase of zeroloss's own catalog (``zeroloss/locale``) that has a different translation must be
absent from the page's visible text. The catalogs themselves must be complete (no empty or
fuzzy entry), so a new string without its translations fails here.
"""

# French typography uses the apostrophe U+2019, as the catalogs do.
# ruff: noqa: RUF001

from __future__ import annotations

import gettext
import html
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import Client
from django.urls import reverse
from django.utils import translation

from tests.support import expire_leases
from zeroloss.models import Message
from zeroloss.service import ZeroLossMessageService

LOCALE = Path(__file__).resolve().parent.parent / "zeroloss" / "locale"
LANGUAGES = ("de", "fr")

#: Phrases each page must show, per language.
EXPECTED = {
    "de": {
        "changelist": [
            "Nachrichten-ID",
            "Warteschlange",
            "Reihenfolgeschlüssel",
            "Versuche",
            "Hängend",
            "Hängende Nachrichten erneut einreihen (abgelaufene Lease)",
            "Blockierte Schlüssel",
            "abgelaufen (hängt)",
            "Ausstehend",
            "Dead Letter",
        ],
        "detail": [
            "Nutzdaten",
            "Prüfprotokoll",
            "Zeitverlauf",
            "Zeitpunkt (Datenbankuhr)",
            "Übergang",
            "Prüfsumme",
            "Probleme",
            "Aktion für diese Nachricht:",
            "Hängt in Bearbeitung: Lease von worker-1",
        ],
        "dashboard": [
            "Nachrichten je Warteschlange und Status",
            "Durchsatz, letzte Stunde (pro Minute)",
            "hängend (abgelaufene Lease)",
            "alle Warteschlangen",
            "ausstehend",
            "abgeschlossen",
            "Kein Replikationsknoten ist registriert.",
            "in Bearbeitung ohne Lease",
        ],
    },
    "fr": {
        "changelist": [
            "Identifiant du message",
            "File",
            "Clé d’ordre",
            "Tentatives",
            "Bloqués",
            "Remettre en file les messages bloqués (bail expiré)",
            "Clés bloquées",
            "expiré (bloqué)",
            "En attente",
            "Lettre morte",
        ],
        "detail": [
            "Contenu",
            "Journal d’audit",
            "Chronologie",
            "à (horloge de la base)",
            "Somme de contrôle",
            "problèmes",
            "Agir sur ce message :",
            "Bloqué en traitement : le bail de worker-1",
        ],
        "dashboard": [
            "Messages par file et par statut",
            "Débit, dernière heure (par minute)",
            "bloqués (bail expiré)",
            "toutes les files",
            "en attente",
            "terminé",
            "Aucun nœud de réplication n’est enregistré.",
            "en traitement sans bail",
        ],
    },
}

_PO_ENTRY = re.compile(
    r'^msgid ((?:"(?:[^"\\]|\\.)*"\n)+)(?:msgid_plural ((?:"(?:[^"\\]|\\.)*"\n)+))?'
    r'((?:msgstr(?:\[\d\])? (?:"(?:[^"\\]|\\.)*"\n?)+)+)',
    re.M,
)


def _joined(block: str) -> str:
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', block)).replace('\\"', '"')


def catalog(lang: str) -> list[tuple[str, list[str]]]:
    """``(msgid, [translations])`` of zeroloss's catalog for ``lang`` (the header left out)."""
    text = (LOCALE / lang / "LC_MESSAGES" / "django.po").read_text(encoding="utf-8")
    entries = []
    for match in _PO_ENTRY.finditer(text):
        msgid = _joined(match.group(1))
        if not msgid:
            continue
        strs = [_joined(s) for s in re.split(r"^msgstr(?:\[\d\])? ", match.group(3), flags=re.M) if s]
        entries.append((msgid, strs))
    return entries


def visible_text(page: str) -> str:
    """What a reader sees: no tags, scripts or styles; entities decoded; whitespace collapsed.
    Attribute texts that are read (``title``, ``aria-label``, button values) are kept."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S | re.I)
    read = " ".join(re.findall(r'(?:title|aria-label|value)="([^"]*)"', page))
    text = re.sub(r"<[^>]+>", " ", page) + " " + read
    return re.sub(r"\s+", " ", html.unescape(text))


@pytest.mark.parametrize("lang", LANGUAGES)
def test_catalog_is_complete_and_compiled(lang: str) -> None:
    po = LOCALE / lang / "LC_MESSAGES" / "django.po"
    mo = po.with_suffix(".mo")
    assert "#, fuzzy" not in po.read_text(encoding="utf-8").split("\n\n", 1)[1]
    entries = catalog(lang)
    assert len(entries) > 200
    untranslated = [msgid for msgid, strs in entries if not all(strs)]
    assert not untranslated, f"{po}: no translation for {untranslated}"
    # The compiled catalog (what Django loads) says what the source says.
    with mo.open("rb") as f:
        compiled = gettext.GNUTranslations(f)
    stale = []
    for msgid, strs in entries:
        got = (
            [compiled.ngettext(msgid, "", n) for n in (1, 2)] if len(strs) > 1 else [compiled.gettext(msgid)]
        )
        if got != strs:
            stale.append(msgid)
    assert not stale, (
        f"{mo} differs from {po} (compile it: cd zeroloss && django-admin compilemessages): {stale}"
    )


@pytest.fixture
def desk(db: None, settings: Any) -> dict[str, Any]:
    """A pending, a stuck and a dead message, and a superuser to look at them."""
    cache.clear()
    worker = ZeroLossMessageService(instance_id="worker-1")
    worker.persist_message("p1", "emails", {"to": "ada@example.com"})
    worker.persist_message("s1", "emails", {"n": 2})
    assert worker.mark_processing("s1")
    assert expire_leases(["s1"]) == 1
    worker.persist_message("d1", "sms", {"n": 3}, max_attempts=1)
    lease = worker.mark_processing("d1")
    assert lease
    assert worker.mark_failed("d1", lease.token, "boom")
    user = User.objects.create_superuser("root", "root@example.com", "pw")
    return {"user": user, "stuck": Message.objects.get(message_id="s1").pk}


def pages(client: Client, stuck_pk: int) -> dict[str, str]:
    urls = {
        "changelist": reverse("admin:zeroloss_message_changelist"),
        "detail": reverse("admin:zeroloss_message_change", args=[stuck_pk]),
        "dashboard": reverse("admin:zeroloss_message_dashboard") + "?refresh=1",
    }
    rendered = {}
    for name, url in urls.items():
        response = client.get(url)
        assert response.status_code == 200, (name, response.status_code)
        rendered[name] = visible_text(response.content.decode())
    return rendered


@pytest.mark.parametrize("lang", LANGUAGES)
def test_admin_pages_render_fully_translated(desk: dict[str, Any], settings: Any, lang: str) -> None:
    settings.LANGUAGE_CODE = lang
    client = Client()
    client.force_login(desk["user"])
    with translation.override(lang):
        rendered = pages(client, desk["stuck"])
    # Phrases the page must show in its language...
    for name, phrases in EXPECTED[lang].items():
        missing = [p for p in phrases if p not in rendered[name]]
        assert not missing, f"{lang} {name}: missing {missing}"
    # ... and no English phrase of ours that has another translation (phrases of two words or
    # more: a single word such as "total" may be the same word, or part of a message's data).
    english = [
        msgid
        for msgid, strs in catalog(lang)
        if " " in msgid and "%(" not in msgid and msgid not in strs and len(msgid) > 8
    ]
    assert len(english) > 100
    for name, text in rendered.items():
        leaked = [msgid for msgid in english if msgid in text]
        assert not leaked, f"{lang} {name}: English left on the page: {leaked}"


def test_english_is_unchanged(desk: dict[str, Any], settings: Any) -> None:
    """The source language still renders as before (the catalogs add, they do not replace)."""
    settings.LANGUAGE_CODE = "en-us"
    client = Client()
    client.force_login(desk["user"])
    with translation.override("en-us"):
        rendered = pages(client, desk["stuck"])
    assert "Requeue stuck messages (expired lease)" in rendered["changelist"]
    assert "Messages per queue and status" in rendered["dashboard"]
    assert "at (database clock)" in rendered["detail"]
