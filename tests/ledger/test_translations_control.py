"""Queue control and cancel speak German and French too: ``zeroloss_queue`` (its table, its
summary line, a usage error, ``--help``), ``zeroloss_cancel``, and the queue-control admin (the
changelist, the pause and resume confirmation pages, the message after confirming), checked as
``tests/ledger/test_translations.py`` checks the other commands and pages: phrases shown in the
language, the English they replace absent, ``--json`` unchanged."""

# French typography uses the apostrophe U+2019, as the catalogs do.
# ruff: noqa: RUF001

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse
from django.utils import translation

from tests.support.cli import run
from tests.support.translations import LANGUAGES, catalog, command_help, visible_text
from zeroloss.ledger import control
from zeroloss.ledger.service import ZeroLossMessageService

QUEUE = "demo.record"  # a handler of the example project

#: Per language: (phrases shown, English replaced) for each output.
PHRASES: dict[str, dict[str, tuple[list[str], list[str]]]] = {
    "de": {
        "empty": (["keine Warteschlange ist pausiert oder begrenzt"], ["no queue is paused"]),
        "summary": ([f"{QUEUE}: pausiert, Nebenläufigkeit 2, Rate unbegrenzt"], ["paused", "unlimited"]),
        "table": (
            [
                "Warteschlange",
                "pausiert",
                "Nebenläufigkeit",
                "Rate",
                "in Bearbeitung",
                "ausstehend",
                "geändert von",
                "ja",
            ],
            ["paused", "concurrency", "rate", "processing", "pending", "changed by", "yes"],
        ),
        "usage": (["--concurrency muss eine ganze Zahl ab 1 sein, erhalten: '0'"], ["must be an integer"]),
        "help": (
            [
                "Eine Warteschlange pausieren oder fortsetzen",
                "limit: die Überschreibungen verwerfen (es gelten die Limits aus den Einstellungen).",
            ],
            ["Pause or resume a queue", "drop the overrides"],
        ),
        "cancel": (
            [
                "c1: abgebrochen (cancelled)",
                "r1: läuft: unverändert gelassen (--abort hält es an)",
                "1 abgebrochen, 0 Anhalten angefordert, 1 unverändert",
            ],
            ["running: left alone", "abort(s) requested", "not changed"],
        ),
        "cancel_err": (["1 von 2 Nachricht(en) wurden nicht abgebrochen"], ["were not cancelled"]),
        "changelist": (
            [
                "Warteschlangensteuerungen",
                "Warteschlange",
                "Zustand",
                "Läuft",
                "Nebenläufigkeit",
                "Rate",
                "Geändert von",
                "Ausgewählte Warteschlangen pausieren (mit Rückfrage)",
                "Ausgewählte Warteschlangen fortsetzen (mit Rückfrage)",
            ],
            ["Pause selected queues", "Resume selected queues", "Changed by", "Running"],
        ),
        "pause": (
            [
                "Diese Warteschlangen pausieren?",
                "Kein Worker übernimmt mehr Nachrichten dieser "
                "Warteschlangen (jeder innerhalb von 1 Sekunde).",
                "Ja, pausieren",
            ],
            ["Pause these queues?", "Yes, pause them"],
        ),
        "resume": (
            [
                "Diese Warteschlangen fortsetzen?",
                "Worker übernehmen die Nachrichten dieser Warteschlangen wieder, im Rahmen ihrer Limits.",
                "Ja, fortsetzen",
            ],
            ["Resume these queues?", "Yes, resume them"],
        ),
        "paused": ([f"1 Warteschlange pausiert: {QUEUE}."], ["Paused 1 queue"]),
    },
    "fr": {
        "empty": (["aucune file n’est en pause ou limitée"], ["no queue is paused"]),
        "summary": ([f"{QUEUE} : en pause, concurrence 2, débit illimité"], ["paused", "unlimited"]),
        "table": (
            ["file", "en pause", "concurrence", "débit", "en traitement", "en attente", "modifié par", "oui"],
            ["paused", "concurrency", "rate", "processing", "pending", "changed by", "yes"],
        ),
        "usage": (["--concurrency doit être un entier à partir de 1, reçu : '0'"], ["must be an integer"]),
        "help": (
            [
                "Mettre en pause ou reprendre une file",
                "limit : supprimer les remplacements (les limites des réglages s’appliquent).",
            ],
            ["Pause or resume a queue", "drop the overrides"],
        ),
        "cancel": (
            [
                "c1: annulé (cancelled)",
                "r1: en cours : laissé tel quel (--abort pour l’arrêter)",
                "1 annulé(s), 0 interruption(s) demandée(s), 1 inchangé(s)",
            ],
            ["running: left alone", "abort(s) requested", "not changed"],
        ),
        "cancel_err": (["1 message(s) sur 2 n’ont pas été annulés"], ["were not cancelled"]),
        "changelist": (
            [
                "Contrôles de file",
                "Nom de la file",
                "État",
                "Active",
                "Concurrence",
                "Débit",
                "Modifié par",
                "Mettre en pause les files sélectionnées (demande confirmation)",
                "Reprendre les files sélectionnées (demande confirmation)",
            ],
            ["Pause selected queues", "Resume selected queues", "Changed by", "Running"],
        ),
        "pause": (
            [
                "Mettre ces files en pause ?",
                "Aucun worker ne prendra plus les messages de ces files (chacun en 1 seconde au plus).",
                "Oui, les mettre en pause",
            ],
            ["Pause these queues?", "Yes, pause them"],
        ),
        "resume": (
            [
                "Reprendre ces files ?",
                "Les workers prennent de nouveau les messages de ces files, dans leurs limites.",
                "Oui, les reprendre",
            ],
            ["Resume these queues?", "Yes, resume them"],
        ),
        "paused": ([f"1 file mise en pause : {QUEUE}."], ["Paused 1 queue"]),
    },
}


@pytest.fixture(autouse=True)
def _fresh_control_cache() -> Iterator[None]:
    control._CONTROLLED.clear()
    yield
    control._CONTROLLED.clear()


def says(lang: str, what: str, text: str) -> None:
    shown, english = PHRASES[lang][what]
    assert [p for p in shown if p not in text] == [], f"{lang} {what}: {text}"
    assert [e for e in english if e in text] == [], f"{lang} {what}: English left: {text}"


@pytest.mark.parametrize("lang", LANGUAGES)
def test_queue_command_speaks_the_language(db: None, settings: Any, lang: str) -> None:
    settings.LANGUAGE_CODE = lang
    empty = run("zeroloss_queue", "show")
    assert empty.code == 0, empty.err
    says(lang, "empty", empty.out)
    assert run("zeroloss_queue", "limit", QUEUE, "--concurrency", "2").code == 0
    paused = run("zeroloss_queue", "pause", QUEUE)
    assert paused.code == 0, paused.err
    says(lang, "summary", paused.out)
    ZeroLossMessageService().persist_message("m1", QUEUE, {})
    table = run("zeroloss_queue", "show")
    assert table.code == 0, table.err
    says(lang, "table", table.out.splitlines()[0] + " " + table.out.splitlines()[2])
    bad = run("zeroloss_queue", "limit", QUEUE, "--concurrency", "0")
    assert bad.code == 2
    says(lang, "usage", bad.err)
    says(lang, "help", " ".join(command_help("zeroloss_queue").split()))


@pytest.mark.parametrize("lang", LANGUAGES)
def test_queue_json_stays_english(db: None, settings: Any, lang: str) -> None:
    ZeroLossMessageService().pause_queue(QUEUE, actor="ops")
    settings.LANGUAGE_CODE = "en-us"
    english = json.loads(run("zeroloss_queue", "show", "--json").out)
    settings.LANGUAGE_CODE = lang
    assert json.loads(run("zeroloss_queue", "show", "--json").out) == english
    assert english["queues"][0]["paused"] is True


@pytest.mark.parametrize("lang", LANGUAGES)
def test_cancel_command_speaks_the_language(db: None, settings: Any, lang: str) -> None:
    service = ZeroLossMessageService(instance_id="worker-1")
    service.persist_message("c1", QUEUE, {})
    service.persist_message("r1", QUEUE, {})
    assert service.claim_message("r1")
    settings.LANGUAGE_CODE = lang
    result = run("zeroloss_cancel", "c1", "r1")
    assert result.code == 1, result  # r1 is running and left alone: incomplete
    says(lang, "cancel", result.out)
    says(lang, "cancel_err", result.err)


@pytest.mark.parametrize("lang", LANGUAGES)
def test_queue_control_admin_renders_fully_translated(db: None, settings: Any, lang: str) -> None:
    ZeroLossMessageService().limit_queue(QUEUE, concurrency=2, actor="ops")
    settings.LANGUAGE_CODE = lang
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    url = reverse("admin:zeroloss_queuecontrol_changelist")
    rendered = {}
    with translation.override(lang):
        page = client.get(url)
        assert page.status_code == 200
        rendered["changelist"] = visible_text(page.content.decode())
        for action in ("pause", "resume"):
            asked = client.post(url, {"action": action, "_selected_action": [QUEUE]})
            assert asked.status_code == 200
            rendered[action] = visible_text(asked.content.decode())
        done = client.post(url, {"action": "pause", "_selected_action": [QUEUE], "post": "yes"})
        assert done.status_code == 302
        rendered["paused"] = visible_text(client.get(done["Location"]).content.decode())
    for name, text in rendered.items():
        says(lang, name, text)
    # As for the other pages: no English phrase of the catalog that has another translation.
    english = [
        msgid
        for msgid, strs in catalog(lang)
        if " " in msgid and "%(" not in msgid and msgid not in strs and len(msgid) > 8
    ]
    for name, text in rendered.items():
        leaked = [msgid for msgid in english if msgid in text]
        assert not leaked, f"{lang} {name}: English left on the page: {leaked}"
