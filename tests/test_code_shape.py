"""The code's shape: SQL text lives in statement catalogues, database differences in the engines.

A scan of ``zeroloss/`` (no database): a string literal that reads as SQL, or a comparison with
a connection's ``vendor``, outside its home fails the test. Run it directly to print the counts
(``python tests/test_code_shape.py [ROOT]``).

The ``.sql`` catalogues (:mod:`zeroloss.ledger.catalogue`) hold statements whole: named
parameters only, the tables by their names, nothing left for the code to splice in.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from django.apps import apps

from zeroloss.ledger import statements_reads
from zeroloss.ledger.catalogue import PARAMETER, Catalogue, CatalogueError, parse

PACKAGE = Path(__file__).resolve().parent.parent / "zeroloss"

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

#: Tables the migrations create without a model (the transactional batch's commit guard).
_TABLES_WITHOUT_MODEL = frozenset({"zeroloss_batch_guard"})
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
CONVERTED = ("ledger/statements_ops.py", "ledger/statements_reads.py")


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


if __name__ == "__main__":
    print(_report(*scan(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE)))
