"""Every code sample in ``README.md``, ``CONTRIBUTING.md`` and ``docs/*.md`` is executed, so the docs cannot drift.

- ```` ```python ```` blocks run, one Markdown file at a time, in document order, in one shared
  namespace (a later block may use what an earlier one defined), against the test database.
  A ``ZEROLOSS`` dict a block defines is validated with the real settings parser, and an
  ``INSTALLED_APPS`` list a block sets must name ``"zeroloss"``. The namespace starts with what
  ``django-admin startproject`` writes in ``settings.py`` (``BASE_DIR``, ``INSTALLED_APPS``,
  ``DATABASES``): a settings sample adds to those, as the reader does
  (``INSTALLED_APPS += ["zeroloss"]``). Handlers the samples register are removed
  afterwards, and the current Celery app is restored.
- ```` ```pycon ```` blocks run as doctests in the same namespace.
- ```` ```bash ```` blocks (also ``sh``/``shell``), line by line: ``python manage.py COMMAND ARGS``
  must name an existing command whose own parser accepts ``ARGS``; read-only commands are
  also run with ``call_command``, at that point of the document; ``make TARGET`` must name a
  target of the Makefile; ``python -m project.demo.run ARGS`` must parse with the demo's parser.
- Blocks meant only to be read use another info string (``text``, ``console``, ``ini``, ...);
  a fence without one fails, so nothing is silently left unchecked.
"""

from __future__ import annotations

import dataclasses
import doctest
import io
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from celery import _state as celery_state

from tests.support.docs import ROOT, Block, blocks, check_manage
from zeroloss.conf import ZeroLossSettings, parse_settings
from zeroloss.core.setting_values import specs
from zeroloss.runtime import handlers
from zeroloss.runtime.worker.transport_runtime import DeliveryRuntime

DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]

RUN = {"python", "py", "python3"}
DOCTEST = {"pycon"}
SHELL = {"bash", "sh", "shell"}
READ_ONLY = {
    *("text", "console", "ini", "toml", "json", "jsonc", "yaml", "mermaid", "sql", "diff", "cfg"),
    *("http", "django", "html", "nginx", "dockerfile"),
}
#: Pages other people are still writing: links to them may dangle until they land.

_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def startproject_settings() -> dict[str, Any]:
    """The names a new project's ``settings.py`` defines that the settings samples build on."""
    base = Path("/srv/mysite")
    return {
        "BASE_DIR": base,
        "INSTALLED_APPS": [
            "django.contrib.admin",
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "django.contrib.messages",
            "django.contrib.staticfiles",
        ],
        "DATABASES": {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": base / "db.sqlite3"}},
    }


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m[1] for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.MULTILINE)}


def _shell_commands(block: Block) -> list[list[str]]:
    """Each command of a shell block as words: continuations joined, comments and env stripped."""
    commands: list[list[str]] = []
    for line in block.text.replace("\\\n", " ").splitlines():
        for part in re.split(r"\s*(?:&&|\|\||;)\s*", line):
            words = shlex.split(part, comments=True)
            while words and _ASSIGNMENT.match(words[0]):
                words.pop(0)
            if words:
                commands.append(words)
    return commands


def _is_python(word: str) -> bool:
    return re.fullmatch(r"(?:\S*/)?python(?:3(?:\.\d+)?)?", word) is not None


def check_demo_args(block: Block, args: list[str]) -> None:
    from project.demo import run

    saved = sys.argv
    sys.argv = ["project.demo.run", *args]
    try:
        run._parse()
    except SystemExit as exc:
        pytest.fail(f"{block.where}: python -m project.demo.run {shlex.join(args)}: rejected ({exc})")
    finally:
        sys.argv = saved


def check_shell(block: Block) -> None:
    targets = _makefile_targets()
    for words in _shell_commands(block):
        if _is_python(words[0]) and words[1:2] == ["manage.py"]:
            check_manage(block, words[2:])
        elif _is_python(words[0]) and words[1:3] == ["-m", "project.demo.run"]:
            check_demo_args(block, words[3:])
        elif words[0] == "make":
            named = [w for w in words[1:] if "=" not in w and not w.startswith("-")]
            missing = sorted(set(named) - targets)
            assert not missing, f"{block.where}: make target(s) {missing} not in the Makefile"


def run_python(block: Block, namespace: dict[str, Any]) -> None:
    # Padding keeps tracebacks pointing at the Markdown file's own line numbers.
    code = compile("\n" * block.line + block.text, str(block.path), "exec")
    exec(code, namespace)
    zl = namespace.get("ZEROLOSS")
    if isinstance(zl, dict):
        parse_settings(zl)  # raises on an unknown key or a bad value, as manage.py check would
    apps = namespace.get("INSTALLED_APPS")
    if isinstance(apps, list | tuple) and re.search(r"^INSTALLED_APPS\b", block.text, re.MULTILINE):
        assert "zeroloss" in apps, f"{block.where}: INSTALLED_APPS without 'zeroloss'"


def run_doctest(block: Block, namespace: dict[str, Any]) -> None:
    parser = doctest.DocTestParser()
    test = parser.get_doctest(block.text, namespace, block.where, str(block.path), block.line)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out = io.StringIO()
    runner.run(test, out=out.write, clear_globs=False)
    assert not runner.failures, out.getvalue()


def test_docs_exist():
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    for required in (
        "README.md",
        "CONTRIBUTING.md",
        "docs/index.md",
        "docs/quickstart.md",
        "docs/concepts.md",
        "docs/guarantees.md",
        "docs/settings.md",
        "docs/celery.md",
        "docs/sweep.md",
        "docs/upgrading.md",
    ):
        assert required in names


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_fence_has_a_known_info_string(path):
    unknown = [
        f"{b.where}: ```{b.info}" for b in blocks(path) if b.info not in RUN | DOCTEST | SHELL | READ_ONLY
    ]
    assert not unknown, "give these blocks an info string (python to run it, text/console to not): " + (
        ", ".join(unknown)
    )


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file."""
    anchors = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", path.read_text(encoding="utf-8"), re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
        anchors.add(slug.replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(path):
    text = path.read_text(encoding="utf-8")
    broken = []
    for target, anchor in re.findall(r"\]\(([^)\s#]*)(?:#([^)\s]*))?\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        resolved = (path.parent / target).resolve() if target else path
        if not resolved.exists():
            broken.append(target)
            continue
        if anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}#{anchor}")
    assert not broken, f"{path.relative_to(ROOT)}: broken links {broken}"


def test_settings_page_covers_every_setting_and_check_id():
    text = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    missing = [f.name for f in dataclasses.fields(ZeroLossSettings) if f"| `{f.name}` |" not in text]
    assert not missing, f"docs/settings.md has no table row for {missing}"
    source = "".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "zeroloss").rglob("*.py")))
    ids = sorted(set(re.findall(r"zeroloss\.[EW]\d{3}", source)))
    assert ids
    undocumented = [i for i in ids if f"`{i}`" not in text]
    assert not undocumented, f"docs/settings.md does not list check ids {undocumented}"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_samples_run(path, settings):
    # Samples may "send email": make sure that can only ever reach the test outbox.
    assert settings.EMAIL_BACKEND == "django.core.mail.backends.locmem.EmailBackend"
    # The samples describe the embedded default: no broker unless a sample says otherwise.
    settings.ZEROLOSS = {**settings.ZEROLOSS, "TRANSPORT": "database"}
    registry = dict(handlers._registry)
    celery_app = celery_state.get_current_app()
    namespace: dict[str, Any] = {"__name__": f"docs.{path.stem}", **startproject_settings()}
    try:
        for block in blocks(path):
            if block.info in RUN:
                run_python(block, namespace)
            elif block.info in DOCTEST:
                run_doctest(block, namespace)
            elif block.info in SHELL:
                check_shell(block)
    finally:
        # A sample that delivered a message started this process's delivery threads (each with
        # its own connection): stop them, or the test database cannot be dropped.
        DeliveryRuntime.close_all()
        handlers._registry.clear()
        handlers._registry.update(registry)
        celery_app.set_current()


def test_the_transition_table_in_the_docs_is_the_one_the_code_uses():
    from zeroloss.ledger.statements import transition_table_markdown

    text = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    between = text.split("<!-- transitions:start -->\n", 1)[1].split("\n<!-- transitions:end -->", 1)[0]
    assert between == transition_table_markdown()


def test_the_settings_tables_in_the_docs_are_the_declared_settings():
    from zeroloss.core.settings import SECTIONS, SETTINGS, settings_table_markdown

    text = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    in_sections = [name for section in SECTIONS.values() for name in specs(section)]
    assert (
        sorted(in_sections)
        == sorted(SETTINGS)
        == sorted(f.name for f in dataclasses.fields(ZeroLossSettings))
    )
    for section in SECTIONS:
        start = f"## {section}\n\n<!-- settings table: {section} -->\n"
        assert start in text, f"docs/settings.md has no table of {section!r} under its heading"
        between = text.split(start, 1)[1].split("\n<!-- settings table end -->", 1)[0]
        assert between == settings_table_markdown(section), f"regenerate the table of {section!r}"


def test_every_key_a_schedule_may_have_has_its_row_in_the_docs():
    from zeroloss.runtime.schedules.spec import KEYS

    text = (ROOT / "docs" / "schedules.md").read_text(encoding="utf-8")
    table = text.split("### Every key\n", 1)[1].strip().split("\n\n", 1)[0]
    documented = {
        key for row in table.splitlines()[2:] for key in re.findall(r"`(\w+)`", row.split(" | ")[0])
    }
    assert documented == KEYS
