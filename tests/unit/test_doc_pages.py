"""Errors and check hints name documentation pages a project that installed zeroloss can find: by
their place in the site's navigation (zeroloss.core.doc_pages), never by a path in the repository;
every page and section they name exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import yaml

from zeroloss.core.doc_pages import PAGES, see

ROOT = Path(__file__).resolve().parents[2]


class _AnyTagLoader(yaml.SafeLoader):
    """mkdocs.yml's python tags (a slugify function) are not this test's business."""


_AnyTagLoader.add_multi_constructor("", lambda loader, suffix, node: None)


def nav_pages() -> dict[str, str]:
    """'Section > Title' -> the Markdown file, from mkdocs.yml's navigation."""
    config: dict[str, Any] = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), _AnyTagLoader)
    found: dict[str, str] = {}

    def walk(items: list[Any], trail: list[str]) -> None:
        for item in items:
            if isinstance(item, dict):
                for title, value in item.items():
                    if isinstance(value, list):
                        walk(value, [*trail, title])
                    else:
                        found[" > ".join([*trail, title][-2:])] = value

    walk(config["nav"], [])
    return found


def strings() -> list[tuple[str, int, str]]:
    """Every string in zeroloss's code that is not a docstring: what users may read."""
    found = []
    for path in sorted((ROOT / "zeroloss").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                found.append((path.relative_to(ROOT).as_posix(), node.lineno, node.value))
    return found


def test_no_error_or_hint_names_a_path_in_the_repository() -> None:
    named = [(p, n, s) for p, n, s in strings() if re.search(r"docs/[\w./-]*\.md|docs/[\w-]+\.md", s)]
    assert not named, f"name the page with zeroloss.core.doc_pages.see(), not its path: {named}"


def test_every_page_named_is_in_the_navigation() -> None:
    nav = nav_pages()
    missing = {key: title for key, title in PAGES.items() if title not in nav}
    assert not missing, f"not in mkdocs.yml's navigation: {missing}"
    assert see("schedules") == "zeroloss documentation: Guides > Periodic messages"


def test_every_section_named_is_a_heading_of_its_page() -> None:
    nav = nav_pages()
    calls = []
    for path in sorted((ROOT / "zeroloss").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "see":
                args = [a.value for a in node.args if isinstance(a, ast.Constant)]
                calls.append((path.name, *args))
    assert len(calls) >= 9
    for where, page, *section in calls:
        assert page in PAGES, (where, page)
        if section:
            text = (ROOT / "docs" / nav[PAGES[page]]).read_text(encoding="utf-8")
            headings = re.findall(r"^#{2,4} (.+)$", text, re.MULTILINE)
            assert section[0] in headings, (where, page, section[0], headings)
