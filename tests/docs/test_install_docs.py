"""The README's and the getting-started page's install and setup, run as written on a fresh
machine: a new virtual environment outside the checkout, the package installed from a copy of
the checkout as the docs say (it is not on PyPI), a new ``django-admin startproject``.

The commands are read from the docs themselves, so the test breaks when the docs drift:

- ```` ```bash ```` blocks run line by line in one ``bash -eu`` script (a failing command fails
  the test); ``cd`` carries over. A ``zeroloss_worker`` line without ``--burst`` runs with it
  appended (as written it would run until stopped).
- A ```` ```python ```` block whose first line is a file's path (``# mysite/settings.py``) is
  appended to that file, relative to the directory the script is in at that point; one whose
  first line is ``# python manage.py shell`` is fed to ``python manage.py shell``. Other Python
  blocks are illustrations, run by tests/docs/test_docs.py only.
- docs/quickstart.md runs whole: venv, install, ``startproject``, settings, ``migrate``,
  ``check``, a send in the shell, a worker, the status commands and the page's ``TestCase``.
- The README's "Add it to a project" section runs in a project of its own, in the same
  environment (the section is about an existing project: the test makes one, ``proj`` with the
  app ``myapp`` the section's paths name, installed, right before its first file).

Marked ``once`` (its tier) and ``postgres_only``: the projects are SQLite, whichever pass runs it.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.support.docs import ROOT, Block, blocks

pytestmark = [pytest.mark.postgres_only]

QUICKSTART = ROOT / "docs" / "quickstart.md"
README = ROOT / "README.md"
README_SECTION = "## Add it to a project"
#: What the README's section takes for granted: an existing project, with the app its paths name
#: installed.
README_PROJECT = (
    "django-admin startproject proj\ncd proj\npython manage.py startapp myapp\n"
    "echo 'INSTALLED_APPS += [\"myapp\"]' >> proj/settings.py\n"
)
#: The checkout's own outputs and environments: not part of what a user clones.
NOT_SOURCE = (
    ".git", ".venv*", "var", "site", "build", "dist", "*.egg-info", "__pycache__", "*.py[cod]",
    ".mypy_cache", ".ruff_cache", ".pytest_cache", "test-artifacts", "*.sqlite3",
)  # fmt: skip
_FILE = re.compile(r"^#\s+([\w./-]+\.py)\b")
_SHELL = "# python manage.py shell"
_EOF = "ZEROLOSS_DOC_EOF"


def _section(path: Path, heading: str) -> tuple[int, int]:
    """The 1-based line range of a ``## `` section."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading) + 1
    end = next((i + 1 for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines) + 1)
    return start, end


def _shell_line(line: str) -> str:
    if re.search(r"manage\.py zeroloss_worker\b", line) and "--burst" not in line:
        command, _, comment = line.partition(" #")
        return f"{command.rstrip()} --burst" + (f"  #{comment}" if comment else "")
    return line


def script(doc_blocks: list[Block], before_first_file: str = "") -> str:
    """The docs' commands and files as one bash script, in document order."""
    parts: list[str] = []
    pending = before_first_file
    for block in doc_blocks:
        if block.info in ("bash", "sh", "shell"):
            parts.append(f"# {block.where}\n" + "\n".join(_shell_line(x) for x in block.text.splitlines()))
        elif block.info == "python":
            first = block.text.splitlines()[0].strip()
            if first == _SHELL:
                parts.append(f"# {block.where}\npython manage.py shell <<'{_EOF}'\n{block.text}{_EOF}")
            elif match := _FILE.match(first):
                parts.append(f"{pending}# {block.where}\ncat >> {match[1]} <<'{_EOF}'\n\n{block.text}{_EOF}")
                pending = ""
    return "\n".join(parts) + "\n"


def fresh_env() -> dict[str, str]:
    """A new user's shell: no virtual environment, no settings module, no test variables (the
    package index configuration stays: pip reads it from there)."""
    keep = ("HOME", "LANG", "LC_ALL", "TMPDIR", "TERM", "USER")
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith("PIP_")}
    path = [p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p).parent / "pyvenv.cfg").exists()]
    env["PATH"] = os.pathsep.join(path)
    return env


def run_script(text: str, cwd: Path, name: str) -> str:
    (cwd / f"{name}.sh").write_text(text, encoding="utf-8")
    done = subprocess.run(
        ["bash", "-eux", f"{name}.sh"],
        cwd=cwd,
        env=fresh_env(),
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{name}: exit code {done.returncode}\n{text}\n---\n{output[-6000:]}"
    return output


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty directory outside the checkout, holding a copy of the checkout as ``zeroloss``."""
    home = tmp_path_factory.mktemp("fresh-machine")
    shutil.copytree(ROOT, home / "zeroloss", ignore=shutil.ignore_patterns(*NOT_SOURCE), symlinks=True)
    return home


@pytest.fixture(scope="module")
def quickstart(machine: Path) -> str:
    return run_script(script(blocks(QUICKSTART)), machine, "quickstart")


def test_the_quickstart_runs_as_written_in_a_fresh_environment(machine: Path, quickstart: str) -> None:
    venv = machine / ".venv"
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import zeroloss; print(zeroloss.__file__)"],
        cwd=machine,
        env=fresh_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Installed into the new environment, not imported from the checkout or its copy.
    assert where.startswith(str(venv)) and "site-packages" in where, where
    # The worker ran the handler: the console email backend printed the email.
    assert "Subject: Welcome!" in quickstart and "To: grace@example.com" in quickstart, quickstart[-4000:]
    with sqlite3.connect(machine / "mysite" / "db.sqlite3") as db:
        status = db.execute(
            "SELECT status, attempts FROM zeroloss_message WHERE message_id = 'welcome-1'"
        ).fetchall()
        reasons = db.execute(
            "SELECT e.reason FROM zeroloss_messageevent e JOIN zeroloss_message m ON e.message_id = m.id "
            "WHERE m.message_id = 'welcome-1' ORDER BY e.id"
        ).fetchall()
    assert status == [("completed", 1)]
    assert [r for (r,) in reasons] == ["persisted", "claimed", "acknowledged"]
    # The page's TestCase ran and passed.
    tail = quickstart[-4000:]
    assert re.search(r"^Ran 1 test", quickstart, re.M) and re.search(r"^OK$", quickstart, re.M), tail


def test_the_readme_adds_it_to_a_project_as_written(machine: Path, quickstart: str) -> None:
    first, last = _section(README, README_SECTION)
    section = [b for b in blocks(README) if first <= b.line < last]
    commands = script(section, before_first_file=README_PROJECT)
    assert "pip install" in commands and "cat >> proj/settings.py" in commands, commands
    assert "manage.py test myapp" in commands, commands
    output = run_script(". .venv/bin/activate\n" + commands, machine, "readme")
    assert re.search(r"^Ran 1 test", output, re.M) and re.search(r"^OK$", output, re.M), output[-4000:]
    installed = subprocess.run(
        [
            str(machine / ".venv" / "bin" / "python"),
            "-c",
            "import celery, psycopg; print(psycopg.pq.__impl__)",
        ],
        env=fresh_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert installed == "binary"  # the README's extras and psycopg's build, as it says


def test_the_install_commands_say_the_package_is_not_on_pypi() -> None:
    """Until it is published, no page tells a user to install it by name from PyPI."""
    by_name = re.compile(r"pip install\s+[\"']?zeroloss(?:\[[^\]]*\])?[\"']?(?:\s|$)")
    offending = []
    for path in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        if path.name == "pypi.md":  # the package index's own page: read where it was installed from
            continue
        for block in blocks(path):
            if block.info in ("bash", "sh", "shell") and by_name.search(block.text):
                offending.append(block.where)
    assert not offending, f"install by name from PyPI, where zeroloss is not published yet: {offending}"
    for path in (README, QUICKSTART):
        assert "not on PyPI yet" in path.read_text(encoding="utf-8"), path
