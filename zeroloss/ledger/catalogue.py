"""Statement catalogues written whole: ``.sql`` files of named statements, read as they are run.

A catalogue file holds sections, each opened by a ``-- name: NAME`` line (as Procrastinate's
``queries.sql``). The text below it, up to the next section, is the statement exactly as the
database runs it, with named parameters (``%(name)s``: psycopg's, and Django's SQLite cursor
takes the same with a dict of values). A statement the two databases spell differently has
one section per database, side by side: ``-- name: NAME [postgresql]`` and
``-- name: NAME [sqlite]``; one that runs on one database only (a PostgreSQL session
setting) has that database's section alone. Lines starting with ``--`` are comments for the reader, and are
not sent. Nothing is spliced into a text: what is written is what runs. The one composition is
PostgreSQL's audit wrapper (``PostgresEngine.audit_wrapper``), which puts a moving statement in
a CTE followed by two sections of the ledger's catalogue that are CTEs, not statements
(``AUDIT_ROWS`` and ``PROMOTE_FINISHED``, each saying so).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path

#: The databases a statement may be written for (``Engine.vendor``).
DIALECTS = ("postgresql", "sqlite")

_SECTION = re.compile(r"^-- name: (?P<name>[A-Z][A-Z0-9_]*)(?: \[(?P<dialect>[a-z]+)\])?\s*$")
#: A named parameter, as both drivers read it.
PARAMETER = re.compile(r"%\((\w+)\)s")


class CatalogueError(ValueError):
    """A catalogue file that does not parse: a duplicate or empty section, an unknown dialect."""


def parse(text: str, origin: str = "<catalogue>") -> dict[str, dict[str, str]]:
    """The statements of a catalogue's text: ``{name: {dialect: statement}}``."""
    sections: list[tuple[str, str | None, list[str]]] = []
    for number, line in enumerate(text.splitlines(), 1):
        opened = _SECTION.match(line)
        if opened:
            dialect = opened["dialect"]
            if dialect is not None and dialect not in DIALECTS:
                raise CatalogueError(f"{origin}:{number}: unknown dialect {dialect!r} (one of {DIALECTS})")
            sections.append((opened["name"], dialect, []))
        elif line.startswith("--") or not line.strip():
            continue
        elif not sections:
            raise CatalogueError(f"{origin}:{number}: a statement before the first '-- name:' line")
        else:
            sections[-1][2].append(line.rstrip())
    statements: dict[str, dict[str, str]] = {}
    for name, dialect, lines in sections:
        if not lines:
            raise CatalogueError(f"{origin}: {name} has no statement")
        texts = statements.setdefault(name, {})
        for each in DIALECTS if dialect is None else (dialect,):
            if each in texts:
                raise CatalogueError(f"{origin}: {name} is written twice for {each}")
            texts[each] = "\n".join(lines)
    return statements


#: The package's root: every ``.sql`` file below it is a catalogue.
PACKAGE = Path(__file__).resolve().parent.parent


class Catalogue:
    """The statements of one ``.sql`` file (its path relative to this package, or absolute)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(__file__).parent / path

    @functools.cached_property
    def statements(self) -> dict[str, dict[str, str]]:
        return parse(self.path.read_text(encoding="utf-8"), str(self.path))

    def texts(self, dialect: str) -> dict[str, str]:
        """Every statement as ``dialect`` runs it, by name."""
        return {name: texts[dialect] for name, texts in self.statements.items() if dialect in texts}

    def __iter__(self) -> Iterator[tuple[str, str, str]]:
        """``(name, dialect, text)`` of every statement."""
        for name, texts in self.statements.items():
            for dialect, text in texts.items():
                yield name, dialect, text

    def __repr__(self) -> str:
        return f"Catalogue({self.path.name!r})"


def package_catalogues() -> list[Catalogue]:
    """Every catalogue of the package (its ``.sql`` files), in path order."""
    return [Catalogue(path) for path in sorted(PACKAGE.rglob("*.sql"))]
