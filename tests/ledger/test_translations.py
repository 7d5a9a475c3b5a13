"""The operator's desk speaks German and French: the changelist, a message's page and the dashboard
render fully translated under ``LANGUAGE_CODE = "de"`` and ``"fr"`` (Django's test client).

"Fully" is checked two ways: phrases each page must show in the language, and every English
phrase of zeroloss's own catalog (``zeroloss/locale``) that has a different translation must be
absent from the page's visible text. The catalogs themselves must be complete (no empty or
fuzzy entry), so a new string without its translations fails here.

The one separate ``manage.py`` process stays: ``--settings`` is read at its startup.
"""

# French typography uses the apostrophe U+2019, as the catalogs do.
# ruff: noqa: RUF001

from __future__ import annotations

import gettext
import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import Client
from django.urls import reverse
from django.utils import translation

from tests.support import expire_leases
from tests.support.cli import cli, run
from tests.support.factories import clear_cache, make_leased, make_stuck
from tests.support.translations import LANGUAGES, LOCALE, catalog, command_help, visible_text
from zeroloss.ledger.models import Message
from zeroloss.ledger.service import ZeroLossMessageService

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
    assert worker.claim_message("s1")
    assert expire_leases(["s1"]) == 1
    worker.persist_message("d1", "sms", {"n": 3}, max_attempts=1)
    lease = worker.claim_message("d1")
    assert lease
    assert worker.fail("d1", lease.token, "boom")
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


# -- the management commands ---------------------------------------------------------------
# Django runs a command in the active language, which is LANGUAGE_CODE's unless something
# activated another (BaseCommand.execute leaves the locale alone; ``@no_translations`` is not
# used). ``settings.LANGUAGE_CODE = ...`` resets the active language, as a new process has it.

#: Per language: phrases the output must show, and the English they replace (must be absent).
COMMAND_PHRASES: dict[str, dict[str, Any]] = {
    "de": {
        "status": (
            [
                "Warteschlange",
                "hängt",
                "älteste ausstehende",
                "Knoten: 0 aktiv, 0 nicht erreichbar",
                "Stand ",
                "(Datenbankuhr)",
                "blockierte Reihenfolgeschlüssel: 0",
            ],
            ["queue", "oldest pending", "nodes:", "as of", "blocked ordering keys"],
        ),
        "requeue": (
            [
                "würde 1 von 2 ausgewählten Nachricht(en) erneut einreihen",
                "Ergebnis",
                "würde erneut einreihen",
                "übersprungen, weil",
                "Lease ist aktiv (--force verwenden)",
            ],
            ["would requeue", "skipped because", "lease is live"],
        ),
        "incomplete": "1 von 2 ausgewählten Nachricht(en) würden nicht erneut eingereiht",
        "worker": "Für die Warteschlange(n) nope ist kein Handler registriert; registriert: ",
        "help": [
            "Nachrichten je Warteschlange und Status anzeigen",
            "(Standard: einmal ausgeben)",
            "Datenbank-Alias (Standard: default)",
            "(Standard: aus)",
        ],
    },
    "fr": {
        "status": (
            [
                "file",
                "bloqué",
                "plus ancien en attente",
                "nœuds : 0 actif(s), 0 hors ligne",
                "au ",
                "(horloge de la base)",
                "clés d’ordre bloquées : 0",
            ],
            ["queue", "oldest pending", "nodes:", "as of", "blocked ordering keys"],
        ),
        "requeue": (
            [
                "remettrait en file 1 des 2 message(s) sélectionné(s)",
                "résultat",
                "serait remis en file",
                "ignoré car",
                "le bail est actif (utilisez --force)",
            ],
            ["would requeue", "skipped because", "lease is live"],
        ),
        "incomplete": "1 des 2 message(s) sélectionné(s) ne seraient pas remis en file",
        "worker": "Aucun handler n’est enregistré pour la ou les files nope ; enregistrées : ",
        "help": [
            "Afficher les messages par file et par statut",
            "(par défaut : afficher une fois)",
            "Alias de la base de données (par défaut : default)",
            "(par défaut : désactivé)",
        ],
    },
}


@pytest.fixture
def ops_ledger(db: None) -> None:
    """A stuck message and one under a live lease, in queue ``q``."""
    clear_cache()
    make_stuck(["s1"])
    make_leased(["live1"])


@pytest.mark.parametrize("lang", LANGUAGES)
def test_commands_speak_the_language(ops_ledger: None, settings: Any, lang: str) -> None:
    settings.LANGUAGE_CODE = lang
    phrases = COMMAND_PHRASES[lang]

    status = run("zeroloss_status", "--no-cache")
    assert status.code == 0, status.err
    shown, english = phrases["status"]
    assert [p for p in shown if p not in status.out] == [], status.out
    assert [e for e in english if e in status.out] == [], status.out

    requeue = run("zeroloss_requeue", "s1", "live1", "--dry-run")
    assert requeue.code == 1, requeue.err  # one of the two is skipped: exit code 1
    shown, english = phrases["requeue"]
    assert [p for p in shown if p not in requeue.out] == [], requeue.out
    assert [e for e in english if e in requeue.out] == [], requeue.out
    assert phrases["incomplete"] in requeue.err

    worker = run("zeroloss_worker", "--queue", "nope", "--burst")
    assert worker.code == 2
    assert phrases["worker"] in worker.err, worker.err

    # --help: argparse formats the translated texts, and the default the formatter appends
    # is in the language (no second, English "(default: ...)").
    text = " ".join(command_help("zeroloss_status").split())
    assert [p for p in phrases["help"] if p not in text] == [], text
    assert "(default:" not in text.replace("(default: %(default)s)", "")


@pytest.mark.parametrize("lang", LANGUAGES)
def test_command_json_stays_english(ops_ledger: None, settings: Any, lang: str) -> None:
    """``--json`` is for programs: the same document in every language."""
    settings.LANGUAGE_CODE = "en-us"
    english = json.loads(run("zeroloss_requeue", "s1", "live1", "--dry-run", "--json").out)
    settings.LANGUAGE_CODE = lang
    translated = json.loads(run("zeroloss_requeue", "s1", "live1", "--dry-run", "--json").out)
    assert translated == english
    assert english["skipped"][0]["reason"] == "lease is live (use --force)"


def test_commands_english_is_unchanged(ops_ledger: None, settings: Any) -> None:
    """The source language prints what it printed before the catalogs (tests compare it)."""
    settings.LANGUAGE_CODE = "en-us"
    status = run("zeroloss_status", "--no-cache")
    assert "oldest pending" in status.out
    assert "nodes: 0 live, 0 down" in status.out
    assert "blocked ordering keys: 0" in status.out
    requeue = run("zeroloss_requeue", "s1", "live1", "--dry-run")
    assert "would requeue 1 of 2 selected message(s)" in requeue.out
    assert "lease is live (use --force)" in requeue.out
    assert "1 of 2 selected message(s) would not be requeued" in requeue.err
    worker = run("zeroloss_worker", "--queue", "nope", "--burst")
    assert "No handler is registered for queue(s) nope; registered: " in worker.err
    text = " ".join(command_help("zeroloss_status").split())
    assert "Refresh every SECONDS until stopped (default: print once)." in text
    assert "Database alias (default: default)." in text
    assert (
        "Read the database now instead of a snapshot up to CACHE_TIMEOUT seconds old. (default: off)" in text
    )


@pytest.mark.process
def test_command_line_speaks_the_settings_language() -> None:
    """``manage.py`` in a new process, ``LANGUAGE_CODE = "de"`` in its settings and nothing
    activated: the usage error, a CommandError and ``--help`` are German, the exit codes unchanged."""
    german = ("--settings", "tests.infra.settings_german")
    bad = cli("zeroloss_status", "--watch", "0", *german)
    assert bad.returncode == 2
    assert "ungültige Zahl '0': erwartet werden endlich viele Sekunden > 0" in bad.stderr, bad.stderr
    worker = cli("zeroloss_worker", "--queue", "nope", "--burst", *german)
    assert worker.returncode == 2
    assert "Für die Warteschlange(n) nope ist kein Handler registriert" in worker.stderr, worker.stderr
    text = " ".join(cli("zeroloss_requeue", "--help", *german).stdout.split())
    assert "Nachrichten-IDs, die erneut eingereiht" in text, text
    assert "Melden, was sich ändern würde, und nichts ändern. (Standard: aus)" in text, text
