"""The code's shape: SQL text lives in statement catalogues, database differences in the engines,
a status is spelled only where it is declared.

A scan of ``zeroloss/`` (no database): a string literal that reads as SQL, or a comparison with
a connection's ``vendor``, outside its home fails the test; so does a Python string equal to a
status (``"dead"``) outside ``zeroloss.core.states``. Run it directly to print the counts
(``python tests/unit/test_code_shape.py [ROOT]``).

The ``.sql`` catalogues (:mod:`zeroloss.ledger.catalogue`) hold statements whole: named
parameters only, the tables by their names, nothing left for the code to splice in.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from django.apps import apps

from zeroloss.core.states import Status
from zeroloss.ledger import statements_reads
from zeroloss.ledger.base import _ENGINES as ENGINES
from zeroloss.ledger.base import all_statements
from zeroloss.ledger.catalogue import PARAMETER, Catalogue, CatalogueError, package_catalogues, parse
from zeroloss.ledger.postgres import PostgresEngine
from zeroloss.ledger.statements import MOVES

PACKAGE = Path(__file__).resolve().parents[2] / "zeroloss"

#: Where SQL text belongs: the statement catalogues (one per area) and the engines.
SQL_HOMES = (
    re.compile(r"(^|/)statements[a-z_]*\.py$"),
    re.compile(r"^ledger/(engine|postgres|sqlite)\.py$"),
    re.compile(r"^migrations/"),  # frozen history
)
#: Where a database's name may be compared: the engines (and frozen migrations).
VENDOR_HOMES = (
    re.compile(r"^ledger/(engine|postgres|sqlite|base)\.py$"),  # base: engine_for() picks the engine
    re.compile(r"^migrations/"),
)
#: Files still waiting for their statements to move, each with its reason (empty is the goal).
ALLOWED: dict[str, str] = {}

# A statement's opening words, in capitals as the code writes SQL (prose says "select").
_SQL = re.compile(
    r"^\s*\(?\s*(SELECT\s|UPDATE\s+\S+\s+(AS\s+\w+\s+)?SET\s|INSERT\s+(OR\s+\w+\s+)?INTO\s|"
    r"DELETE\s+FROM\s|WITH\s+RECURSIVE\s|LISTEN\s|SET\s+LOCAL\s|COPY\s+\S+)",
    re.DOTALL,
)


def _text(node: ast.AST) -> str | None:
    """The literal text of a string or an f-string (its placeholders as ``{}``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    return None


def _is_vendor(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "vendor") or (
        isinstance(node, ast.Name) and node.id == "vendor"
    )


def scan(root: Path = PACKAGE) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """``(sql, vendor)``: per file of ``root`` outside its home, the lines of SQL text and of
    comparisons with a vendor."""
    sql: dict[str, list[int]] = {}
    vendor: dict[str, list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), rel)
        docstrings = {
            id(body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and (body := node.body)
            and isinstance(body[0], ast.Expr)
        }
        # The literal pieces of an f-string are read as part of it.
        pieces = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
        skipped = docstrings | pieces
        for node in ast.walk(tree):
            if isinstance(node, ast.JoinedStr | ast.Constant) and id(node) not in skipped:
                text = _text(node)
                if text and _SQL.match(text) and not any(h.search(rel) for h in SQL_HOMES):
                    sql.setdefault(rel, []).append(node.lineno)
            if (
                isinstance(node, ast.Compare)
                and any(_is_vendor(n) for n in (node.left, *node.comparators))
                and not any(h.search(rel) for h in VENDOR_HOMES)
            ):
                vendor.setdefault(rel, []).append(node.lineno)
    return sql, vendor


def _total(found: dict[str, list[int]]) -> int:
    return sum(len(set(lines)) for lines in found.values())


def _report(sql: dict[str, list[int]], vendor: dict[str, list[int]]) -> str:
    lines = [f"SQL text outside the catalogues: {_total(sql)} in {len(sql)} files"]
    lines += [f"  {rel}: {sorted(set(n))}" for rel, n in sql.items()]
    lines.append(f"vendor branches outside the engines: {_total(vendor)} in {len(vendor)} files")
    lines += [f"  {rel}: {sorted(set(n))}" for rel, n in vendor.items()]
    return "\n".join(lines)


def test_sql_and_vendor_branches_stay_home() -> None:
    sql, vendor = scan()
    print(_report(sql, vendor))
    stray_sql = {rel: n for rel, n in sql.items() if rel not in ALLOWED}
    stray_vendor = {rel: n for rel, n in vendor.items() if rel not in ALLOWED}
    assert not stray_sql and not stray_vendor, (
        "move SQL into a statements*.py catalogue and ask the engine (a capability on "
        "zeroloss/ledger/engine.py's Engine) instead of the vendor:\n" + _report(stray_sql, stray_vendor)
    )


def test_the_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    (tmp_path / "reads.py").write_text(
        'T = "t"\nQ = f"SELECT id FROM {T} WHERE x = %s"\n'
        "def f(conn):\n    return conn.vendor == 'postgresql'\n"
    )
    (tmp_path / "statements_reads.py").write_text('Q = "SELECT id FROM t"\n')
    sql, vendor = scan(tmp_path)
    assert sql == {"reads.py": [2]}
    assert vendor == {"reads.py": [4]}


# -- the whole statements of the .sql catalogues ------------------------------------------------

#: Tables without a model: the transactional batch's commit guard (a migration creates it), a
#: large batch's staged rows (a temporary table, sql/inserts.sql).
_TABLES_WITHOUT_MODEL = frozenset({"zeroloss_batch_guard", "zeroloss_staged"})
_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE|JOIN|TABLE)\s+(zeroloss_\w+)")


def _whole_statements() -> list[tuple[str, str, str, str]]:
    """``(file, name, dialect, text)`` of every statement of every ``.sql`` catalogue."""
    return [
        (path.relative_to(PACKAGE).as_posix(), *statement)
        for path in sorted(PACKAGE.rglob("*.sql"))
        for statement in Catalogue(path)
    ]


def test_catalogue_statements_are_whole_with_named_parameters() -> None:
    statements = _whole_statements()
    assert statements, "no .sql catalogue found"
    tables = {m._meta.db_table for m in apps.get_app_config("zeroloss").get_models()} | _TABLES_WITHOUT_MODEL
    for origin, name, dialect, text in statements:
        where = f"{origin} {name} [{dialect}]"
        # Every % is a named parameter or a literal percent sign (%%): no positional %s.
        assert "%" not in PARAMETER.sub("", text).replace("%%", ""), f"{where}: a positional or stray %"
        # Nothing left for the code to fill in: no template placeholder, no unbalanced brace.
        assert not re.search(r"\{\w*\}", text), f"{where}: a template placeholder"
        unknown = set(_TABLE.findall(text)) - tables
        assert not unknown, f"{where}: tables no model or migration names: {sorted(unknown)}"


#: Catalogue modules whose statements are all in a ``.sql`` file.
CONVERTED = (
    "ledger/statements_ops.py",
    "ledger/statements_reads.py",
    "runtime/schedules/statements.py",
    "integrations/replication/statements.py",
    "ledger/statements_control.py",
    "ledger/statements_cancel.py",
)


def test_a_converted_catalogue_module_keeps_no_statement_text() -> None:
    """A module whose statements moved to a ``.sql`` file keeps no statement of its own (a
    function that writes one around identifiers, which no parameter can be, is no statement)."""
    for module in CONVERTED:
        tree = ast.parse((PACKAGE / module).read_text())
        assigned = [n.value for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign) and n.value]
        texts = [t for value in assigned for node in ast.walk(value) if (t := _text(node)) and _SQL.match(t)]
        assert not texts, f"{module} still writes SQL: {texts}"


def test_conservation_counts_the_statuses_in_their_order() -> None:
    for name in ("CONSERVATION", "CONSERVATION_OF_QUEUE"):
        for dialect, text in statements_reads.CATALOGUE.statements[name].items():
            counted = tuple(re.findall(r"status = '(\w+)'", text))
            assert counted == statements_reads.CONSERVATION_STATUSES, (name, dialect)


def built_at_run_time() -> set[tuple[str, str]]:
    """``(name, dialect)`` of each statement whose run text the code assembles from fragments
    (templates rendered, transitions composed around a whole statement, DDL filled in), not
    run as a ``.sql`` catalogue writes it."""
    written = {
        (name, dialect): text for catalogue in package_catalogues() for name, dialect, text in catalogue
    }
    return {
        (name, dialect) for name, dialect, text in all_statements() if written.get((name, dialect)) != text
    }


def test_all_statements_yields_every_statement_as_each_database_runs_it() -> None:
    found = {(name, dialect): text for name, dialect, text in all_statements()}
    assert all(text.strip() for text in found.values())
    for origin, name, dialect, text in _whole_statements():
        # A moving statement as its transition runs it (PostgreSQL: inside its audit CTE).
        assert text in found[name, dialect], f"{origin} {name} [{dialect}]"
    for name, moving in MOVES.items():
        for dialect in ("postgresql", "sqlite"):
            assert "RETURNING" in found[name, dialect], f"{name} [{dialect}]: not as its transition runs it"
        assert ("INSERT INTO zeroloss_messageevent" in found[name, "postgresql"]) is True
        assert ((f"{name}+PROMOTE", "postgresql") in found) == moving.finishes


def test_a_whole_moving_statement_returns_what_its_declared_edges_require() -> None:
    """A moving statement written whole spells its RETURNING columns (the audit row's source
    status, reason and detail): they are what its declaration in ``MOVES`` derives."""
    checked = 0
    for dialect, engine in ENGINES.items():
        for name in engine.whole & set(MOVES):
            written = " ".join(engine.sql[name].split())
            derived = " ".join(MOVES[name].returning_sql(notify=engine.has_listen_notify).split())
            if name in engine.complete:
                # Written with its audit rows (PostgreSQL's persisting statements): the tail
                # the audit wrapper derives for any other moving statement.
                assert isinstance(engine, PostgresEngine), name
                tail = " ".join(engine.audit_tail(name).split())
                assert written.endswith(f" RETURNING {derived}), {tail}"), f"{name} [{dialect}]: not {tail}"
            else:
                assert written.endswith(f" RETURNING {derived}"), (
                    f"{name} [{dialect}]: RETURNING is not {derived}"
                )
            checked += 1
    # The operator's moves, cancel's, the outcomes, the claims, the sweep and the persisting
    # statements, on both databases.
    assert checked >= 2 * 28, checked
    assert ENGINES["postgresql"].complete == {n for n in MOVES if n.startswith("INSERT_")}
    assert ENGINES["sqlite"].complete == set()


# -- statement text composed at run time ----------------------------------------------------------

#: Where the ledger composes statement text at run time (``+``, ``%``, ``.format``, ``.replace``,
#: an f-string with SQL in it), each with its reason: every other statement is read whole from a
#: ``.sql`` catalogue.
COMPOSED: dict[str, tuple[frozenset[str], str]] = {
    "ledger/postgres.py": (
        frozenset({"audit_wrapper", "audit_tail", "<module>"}),
        "the audit rows' CTE around a moving statement (PostgresEngine.audit_wrapper; <module>: its "
        "columns as epoch seconds): written out, every moving statement twice, and again for +PROMOTE",
    ),
    "ledger/partitions.py": (frozenset(), "partition DDL around partition names, which no parameter can be"),
    "ledger/periods.py": (frozenset(), "partition DDL around partition names, which no parameter can be"),
    "ledger/partition_drops.py": (
        frozenset(),
        "partition DDL around partition names, which no parameter can be",
    ),
    "ledger/conversion.py": (frozenset(), "the layout conversion's DDL around its tables' names"),
    "ledger/statements_reads.py": (frozenset({"distinct_walk"}), "a walk of any table's indexed column"),
    "ledger/statements_moves.py": (
        frozenset({"returning_sql", "reason_sql"}),
        "the RETURNING columns a moving statement's declaration derives: what a test checks its "
        "written text against, never run",
    ),
}
_SQL_WORD = re.compile(
    r"\b(SELECT|INSERT INTO|UPDATE|DELETE FROM|WITH|RETURNING|CREATE|ALTER|DROP|COPY|FROM|WHERE|SET|AND|JOIN|UNION)\b"
)


def _sqlish(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(_SQL_WORD.search(node.value))
    )


def composed_statements(root: Path = PACKAGE / "ledger") -> dict[str, set[str]]:
    """Per file of ``root``: the functions (``<module>`` for the top level) that compose SQL text."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        where: dict[ast.AST, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    where.setdefault(inner, node.name)
        for node in ast.walk(tree):
            hit = (
                (isinstance(node, ast.JoinedStr) and any(_sqlish(v) for v in node.values))
                or (
                    isinstance(node, ast.BinOp)
                    and isinstance(node.op, ast.Add | ast.Mod)
                    and (_sqlish(node.left) or _sqlish(node.right))
                )
                or (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("format", "replace", "join")
                    and (
                        _sqlish(node.func.value)
                        or any(_sqlish(a) for a in node.args)
                        # A named template's .format (sql.CENSUS.format(part=...)).
                        or (
                            node.func.attr == "format"
                            and isinstance(node.func.value, ast.Attribute | ast.Name)
                            and str(
                                getattr(node.func.value, "attr", None) or getattr(node.func.value, "id", "")
                            ).isupper()
                        )
                    )
                )
            )
            if hit:
                found.setdefault(path.relative_to(root.parent).as_posix(), set()).add(
                    where.get(node, "<module>")
                )
    return found


def test_the_ledger_composes_no_statement_but_its_audit_wrapper_and_ddl() -> None:
    """Every statement of the ledger is read whole from a ``.sql`` catalogue, but the audit
    wrapper (one function) and the DDL around identifiers (COMPOSED, each with its reason)."""
    found = composed_statements()
    stray = {
        rel: sorted(functions - COMPOSED[rel][0])
        if rel in COMPOSED and COMPOSED[rel][0]
        else sorted(functions)
        for rel, functions in found.items()
        if rel not in COMPOSED or (COMPOSED[rel][0] and not functions <= COMPOSED[rel][0])
    }
    assert stray == {}, f"statement text composed at run time (write it whole in a .sql catalogue): {stray}"
    assert found["ledger/postgres.py"] == {"audit_wrapper", "audit_tail", "<module>"}


def test_the_composition_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    (ledger / "a.py").write_text(
        "X = 'SELECT 1 FROM t' + ' WHERE y'\n"
        "def f(t):\n    return f'UPDATE {t} SET a = 1'\n"
        "def g(s):\n    return s.replace('LIMIT 1', 'LIMIT 2 FOR UPDATE')\n"
        "def h(sql):\n    return sql.CENSUS.format(part='p')\n"
        "def fine(x):\n    return f'not {x} sql' + 'either'\n"
    )
    assert composed_statements(ledger) == {"ledger/a.py": {"<module>", "f", "g", "h"}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SELECT 1", "before the first"),
        ("-- name: A\n-- name: B\nSELECT 1", "A has no statement"),
        ("-- name: A\nSELECT 1\n-- name: A [sqlite]\nSELECT 2", "written twice for sqlite"),
        ("-- name: A [oracle]\nSELECT 1", "unknown dialect"),
    ],
)
def test_a_bad_catalogue_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(CatalogueError, match=message):
        parse(text)


def test_a_catalogue_reads_as_written() -> None:
    parsed = parse(
        "-- a comment for the reader\n-- name: BOTH\nSELECT x\n  FROM t WHERE y = %(y)s\n\n"
        "-- name: ONE [postgresql]\nSELECT now()\n-- name: ONE [sqlite]\n-- why it differs\nSELECT 2\n"
    )
    assert parsed == {
        "BOTH": {
            "postgresql": "SELECT x\n  FROM t WHERE y = %(y)s",
            "sqlite": "SELECT x\n  FROM t WHERE y = %(y)s",
        },
        "ONE": {"postgresql": "SELECT now()", "sqlite": "SELECT 2"},
    }


# -- statuses: declared once (zeroloss.core.states), every other module derives from the declaration ----

#: Every status's value, as ``zeroloss.core.states.Status`` declares it.
STATUS_VALUES = frozenset(Status.values)
#: Where a status may be spelled in Python: its declaration, and frozen migrations. SQL text
#: spells them inside longer strings (checked against the declaration below).
STATUS_HOMES = (re.compile(r"(^|/)states\.py$"), re.compile(r"^migrations/"))
#: Calls whose string argument is text for a reader (a translation's msgid), not a status.
_READER_TEXT = {"_", "gettext", "gettext_lazy", "gettext_noop", "pgettext", "pgettext_lazy", "ngettext"}
#: Calls whose second argument names an attribute.
_ATTRIBUTE_NAME = {"getattr", "setattr", "hasattr", "delattr"}


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _not_statuses(tree: ast.AST) -> set[int]:
    """The ids of string constants that equal a status's value but are words of another kind:
    a translation's msgid, an attribute's name (``getattr``, ``__slots__``, ``__all__``), a
    member of another vocabulary's enum (``Outcome.COMPLETED = "completed"``), or a field name
    of a record (a dict display whose keys are string literals, not all of them statuses)."""
    skip: set[int] = set()

    def strings(nodes: list[ast.expr]) -> set[int]:
        return {id(n) for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _call_name(node)
            if name in _READER_TEXT:
                skip |= strings(node.args)
            elif name in _ATTRIBUTE_NAME and len(node.args) > 1:
                skip |= strings(node.args[1:2])
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id in ("__slots__", "__all__") for t in node.targets
        ):
            if isinstance(node.value, ast.Tuple | ast.List):
                skip |= strings(node.value.elts)
        elif isinstance(node, ast.ClassDef) and any(
            (b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "").endswith(
                ("Enum", "Choices")
            )
            for b in node.bases
        ):
            for item in node.body:
                if isinstance(item, ast.Assign):
                    value = item.value.elts[0] if isinstance(item.value, ast.Tuple) else item.value
                    skip |= strings([value])
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if k is not None]
            texts = [k.value for k in keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            if len(texts) == len(keys) and not set(texts) <= STATUS_VALUES:
                skip |= strings(keys)
    return skip


def status_literals(root: Path = PACKAGE) -> dict[str, list[int]]:
    """Per file of ``root`` outside a status's home: the lines of a string equal to a status."""
    found: dict[str, list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(h.search(rel) for h in STATUS_HOMES):
            continue
        tree = ast.parse(path.read_text(), rel)
        skip = _not_statuses(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in STATUS_VALUES and id(node) not in skip:
                found.setdefault(rel, []).append(node.lineno)
    return {rel: sorted(lines) for rel, lines in found.items()}


def test_a_status_is_spelled_only_where_it_is_declared() -> None:
    assert {"pending", "processing", "completed", "dead", "cancelled"} <= STATUS_VALUES, STATUS_VALUES
    found = status_literals()
    assert not found, (
        "a status spelled as a string outside zeroloss/core/states.py: use its Status member, or a set "
        "of zeroloss.core.states (LIVE_STATUSES, FINISHED_STATUSES, ...; add one there if the code "
        "needs another):\n" + "\n".join(f"  {rel}: {sorted(set(n))}" for rel, n in found.items())
    )


def test_the_status_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    (tmp_path / "uses.py").write_text(
        "from enum import StrEnum\n"
        "from django.utils.translation import gettext as _\n"
        "class Outcome(StrEnum):\n    COMPLETED = 'completed'\n"  # another vocabulary: fine
        "def f(m, counts):\n"
        "    if m.status == 'dead':\n"  # 6: a status
        "        return {'name': m.name, 'dead': counts}\n"  # a record's field: fine
        "    q = m.filter(status__in=['pending', 'processing'])\n"  # 8: a hand-written set
        "    ages = {'completed': 1, 'cancelled': 2}\n"  # 9: keyed by status
        "    return getattr(m, 'pending', _('cancelled'))\n"  # an attribute, a msgid: fine
    )
    (tmp_path / "states.py").write_text("PENDING = 'pending'\n")
    assert status_literals(tmp_path) == {"uses.py": [6, 8, 8, 9, 9]}


# -- statuses in SQL: a literal a statement spells is a declared status, a set a declared set -------

#: Where a statement spells a status: compared with a status column (``status = 'dead'``,
#: ``h.status <> 'pending'``), or written to one through a CASE (``SET status = CASE ... THEN
#: 'dead' ELSE 'pending' END``), or named as a row's status (``CAST('processing' AS TEXT) AS
#: from_status``), or inserted into one (``INSERT INTO t (..., status, ...) VALUES (..., 'pending', ...)``).
_COMPARED = re.compile(r"\b\w*status\s*(?:=|<>|!=)\s*'(\w*)'")
_SET = re.compile(r"\b\w*status\s+(?:NOT\s+)?IN\s*\(([^()]*)\)", re.IGNORECASE)
_CASE = re.compile(r"\bstatus\s*=\s*CASE\b")
_NAMED = re.compile(r"(?:CAST\(\s*)?'(\w*)'(?:\s+AS\s+\w+\s*\))?\s+AS\s+\w*status\b")
_INSERT = re.compile(r"\bINSERT\s+INTO\s+\S+\s*\(([^()]*)\)\s*(VALUES\s*\(|SELECT\s)")
_QUOTED = re.compile(r"'((?:[^']|'')*)'")


def _top_level(text: str, start: int, stop_at_from: bool) -> list[tuple[int, str]]:
    """The comma-separated items of ``text`` from ``start`` at parenthesis depth 0 (quotes
    skipped), up to the closing parenthesis or, in a SELECT list, its FROM."""
    items: list[tuple[int, str]] = []
    depth, begin, i = 0, start, start
    while i < len(text):
        c = text[i]
        if c == "'":
            i = text.index("'", i + 1) + 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            items.append((begin, text[begin:i]))
            begin = i + 1
        elif depth == 0 and stop_at_from and re.match(r"\sFROM\s", text[i : i + 6], re.IGNORECASE):
            break
        i += 1
    items.append((begin, text[begin:i]))
    return items


def status_spellings(text: str) -> tuple[list[tuple[int, str]], list[frozenset[str]]]:
    """``(literals, sets)`` of one statement: each literal spelled where a status goes (its
    offset, its text), and each set spelled in an ``IN (...)`` of a status column."""
    literals: list[tuple[int, str]] = []
    sets: list[frozenset[str]] = []
    literals += [(m.start(1) - 1, m[1]) for m in _COMPARED.finditer(text)]
    # A first audit row's from_status is '' (the message did not exist: ``Transition.source``).
    literals += [(m.start(1) - 1, m[1]) for m in _NAMED.finditer(text) if m[1] or "from_status" not in m[0]]
    for m in _SET.finditer(text):
        spelled = [(m.start(1) + q.start(), q[1]) for q in _QUOTED.finditer(m[1])]
        literals += spelled
        sets.append(frozenset(value for _, value in spelled))
    for m in _CASE.finditer(text):
        depth, i = 0, m.end()
        for word in re.finditer(r"\b(CASE|END|THEN|ELSE)\b\s*('(\w*)')?", text[m.end() :]):
            if word[1] == "CASE":
                depth += 1
            elif word[1] == "END":
                if depth == 0:
                    break
                depth -= 1
            elif depth == 0 and word[2]:
                literals.append((i + word.start(2), word[3]))
    for m in _INSERT.finditer(text):
        columns = [c.strip() for c in m[1].split(",")]
        values = _top_level(text, m.end(), stop_at_from=m[2].upper().startswith("SELECT"))
        for column, (offset, value) in zip(columns, values, strict=False):
            quoted = _QUOTED.fullmatch(value.strip())
            if column.endswith("status") and quoted:
                literals.append((offset + value.index("'"), quoted[1]))
    return literals, sets


def catalogue_statements() -> list[tuple[str, str]]:
    """``(where, text)`` of every SQL statement zeroloss runs, as each database runs it: the
    ledger's (:func:`zeroloss.ledger.base.all_statements`), and the templates of the other
    areas' ``statements*`` modules as written."""
    import importlib
    import pkgutil

    import zeroloss

    found = [(f"{name} [{dialect}]", text) for name, dialect, text in all_statements()]
    for info in pkgutil.walk_packages(zeroloss.__path__, "zeroloss."):
        area, _, module = info.name.rpartition(".")
        if module.startswith("statements") and area != "zeroloss.ledger":
            templates = vars(importlib.import_module(info.name)).items()
            found += [(f"{info.name}.{n}", t) for n, t in templates if n.isupper() and isinstance(t, str)]
    return found


def stray_status_spellings(statements: list[tuple[str, str]]) -> list[str]:
    """What a statement spells wrong: a literal in a status's place that is no declared status,
    a set that is no declared set, a status literal in a place this scan does not read."""
    from zeroloss.core.states import STATUS_SETS

    declared_sets = set(STATUS_SETS.values())
    problems: list[str] = []
    for where, text in statements:
        literals, sets = status_spellings(text)
        read = {offset for offset, _ in literals}
        problems += [
            f"{where}: '{v}' is not a declared status" for _, v in literals if v not in STATUS_VALUES
        ]
        problems += [
            f"{where}: the set {sorted(s)} is none of zeroloss.core.states.STATUS_SETS"
            for s in sets
            if s not in declared_sets
        ]
        problems += [
            f"{where}: '{q[1]}' at {q.start()} is a status where the scan does not read one"
            for q in _QUOTED.finditer(text)
            if q[1] in STATUS_VALUES and q.start() not in read
        ]
    return problems


def test_every_status_a_statement_spells_is_declared_and_every_set_a_declared_set() -> None:
    statements = catalogue_statements()
    assert {w.rpartition("[")[2] for w, _ in statements} >= {"postgresql]", "sqlite]"}  # both databases read
    spelled = {v for _, t in statements for _, v in status_spellings(t)[0]}
    assert spelled == STATUS_VALUES, spelled  # every status is written somewhere (the scan reads)
    problems = stray_status_spellings(statements)
    assert not problems, "\n".join(problems)


def test_the_sql_status_scan_finds_what_it_looks_for() -> None:
    good = [
        ("claim", "UPDATE m SET status = 'processing' WHERE status = 'pending' AND h.status <> 'dead'"),
        ("fail", "UPDATE m SET status = CASE WHEN a >= b THEN 'dead' ELSE 'pending' END, x = 'y'"),
        ("why", "SELECT CASE WHEN status = 'dead' THEN 'dead_lettered' END AS reason FROM m"),
        ("audit", "SELECT id, CAST('processing' AS TEXT) AS from_status, 'acked' AS reason FROM t"),
        ("send", "INSERT INTO m (id, status, k) VALUES (%s, 'pending', CASE WHEN %s THEN '' END)"),
        ("sendmany", "INSERT INTO m (id, status) SELECT b.id, 'pending' FROM b"),
        ("heads", "SELECT 1 FROM m h WHERE h.status IN ('pending', 'processing')"),
    ]
    assert stray_status_spellings(good) == []
    bad = [
        ("typo", "UPDATE m SET status = 'pendng' WHERE id = %s"),
        ("case", "UPDATE m SET status = CASE WHEN a THEN 'gone' ELSE 'pending' END"),
        ("insert", "INSERT INTO m (id, status) VALUES (%s, 'parked')"),
        ("set", "SELECT 1 FROM m WHERE status IN ('pending', 'dead')"),
        ("unread", "SELECT 'dead' = ANY(x) FROM m"),
    ]
    assert [p.partition(":")[0] for p in stray_status_spellings(bad)] == [
        "typo",
        "case",
        "insert",
        "set",
        "unread",
    ]


if __name__ == "__main__":
    print(_report(*scan(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE)))
    literals = status_literals(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE)
    print(f"status literals outside zeroloss/core/states.py: {_total(literals)} in {len(literals)} files")
    for rel, lines in literals.items():
        print(f"  {rel}: {sorted(set(lines))}")
    built = built_at_run_time()
    print(
        f"statements built at run time from fragments: {len(built)} texts, "
        f"{len({name.split('+')[0] for name, _ in built})} statements"
    )


# -- the service's flat names: each one part's operation, written once ------------------------


def test_the_services_flat_names_are_its_parts_operations_written_once() -> None:
    """No hand-written forwarding: each flat name of the service is declared as one part's method
    (``claim = operation(Leases.claim)``) and, on a service, is that method bound to the part, with
    its signature and docstring (what help() and the reference docs show)."""
    import inspect

    from zeroloss.ledger.service import ZeroLossMessageService
    from zeroloss.ledger.surface import PART_ATTRIBUTES, operation

    body = vars(ZeroLossMessageService)
    written = [n for n, v in body.items() if inspect.isfunction(v) and not n.startswith("_")]
    assert written == [], f"methods written on the service instead of declared: {written}"
    declared = {n: v for n, v in body.items() if isinstance(v, operation)}
    assert {"claim", "record_outcomes", "persist_message", "sweep", "cancel_messages"} <= set(declared)
    service = ZeroLossMessageService()
    for name, declaration in declared.items():
        method = getattr(service, name)
        part = getattr(service, declaration.part)
        assert declaration.part in PART_ATTRIBUTES.values()
        assert getattr(method, "__self__", part) is part, name  # a deprecated name wraps it
        assert (method.__doc__ or "").strip(), f"{name}: no docstring for help() and the docs"
        unbound = inspect.signature(getattr(ZeroLossMessageService, name))
        assert inspect.signature(method) == unbound.replace(parameters=list(unbound.parameters.values())[1:])
    assert service.claim.__func__ is service.leases.claim.__func__  # type: ignore[attr-defined]
    assert service.__dict__["claim"] == service.leases.claim  # later lookups: the part's method, directly


def test_an_operation_must_belong_to_a_part() -> None:
    from zeroloss.ledger.surface import operation

    with pytest.raises(TypeError, match="no operation of a part"):
        operation(str.upper)


if TYPE_CHECKING:  # checked by mypy (warn_unused_ignores): the flat names keep their parts' types
    from zeroloss.ledger.service import ZeroLossMessageService as _Service

    _Service().claim("q", limit="many")  # type: ignore[arg-type]
    _Service().record_outcomes([], locked=1.5)  # type: ignore[arg-type]


# -- file length ----------------------------------------------------------------------------------
#: The longest a module of zeroloss/ may be: longer, it holds more than one thing.
MAX_LINES = 400
#: Modules allowed over it, each at most its present length: none (split, never grow).
LONG_FILES: dict[str, int] = {}


def long_files(root: Path = PACKAGE) -> dict[str, int]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and "migrations" not in path.parts:
            found[path.relative_to(root).as_posix()] = lines
    return found


def test_no_module_is_over_400_lines():
    found = long_files()
    grown = {rel: n for rel, n in found.items() if n > LONG_FILES.get(rel, MAX_LINES)}
    assert grown == {}, f"split these modules (at most {MAX_LINES} lines each): {grown}"
