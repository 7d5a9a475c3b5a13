"""zeroloss's gettext catalogs as data, and a page's text as a reader sees it."""

from __future__ import annotations

import html
import re

from django.core.management import load_command_class

from tests.support import ROOT

LOCALE = ROOT / "zeroloss" / "locale"
LANGUAGES = ("de", "fr")


#: What separates an entry's context from its msgid in a compiled catalog (GNU gettext's EOT).
CONTEXT = "\x04"


_PO_ENTRY = re.compile(
    r'^(?:msgctxt ((?:"(?:[^"\\]|\\.)*"\n)+))?msgid ((?:"(?:[^"\\]|\\.)*"\n)+)(?:msgid_plural ((?:"(?:[^"\\]|\\.)*"\n)+))?'
    r'((?:msgstr(?:\[\d\])? (?:"(?:[^"\\]|\\.)*"\n?)+)+)',
    re.M,
)


def _joined(block: str) -> str:
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', block)).replace('\\"', '"')


def catalog(lang: str) -> list[tuple[str, list[str]]]:
    """``(msgid, [translations])`` of zeroloss's catalog for ``lang`` (the header left out).

    An entry with a context (``pgettext``) is keyed as the compiled catalog keys it: the
    context, the separator ``CONTEXT``, then the msgid."""
    text = (LOCALE / lang / "LC_MESSAGES" / "django.po").read_text(encoding="utf-8")
    entries = []
    for match in _PO_ENTRY.finditer(text):
        msgid = _joined(match.group(2))
        if not msgid:
            continue
        if match.group(1):
            msgid = f"{_joined(match.group(1))}{CONTEXT}{msgid}"
        strs = [_joined(s) for s in re.split(r"^msgstr(?:\[\d\])? ", match.group(4), flags=re.M) if s]
        entries.append((msgid, strs))
    return entries


def visible_text(page: str) -> str:
    """What a reader sees: no tags, scripts or styles; entities decoded; whitespace collapsed.
    Attribute texts that are read (``title``, ``aria-label``, button values) are kept."""
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S | re.I)
    read = " ".join(re.findall(r'(?:title|aria-label|value)="([^"]*)"', page))
    text = re.sub(r"<[^>]+>", " ", page) + " " + read
    return re.sub(r"\s+", " ", html.unescape(text))


def command_help(command: str) -> str:
    return load_command_class("zeroloss", command).create_parser("manage.py", command).format_help()
