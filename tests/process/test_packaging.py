"""The packages as a distribution builds them: ``python -m build`` from a clean copy of the tree,
without build isolation (this environment's setuptools, the build-system requirement), then
``twine check --strict`` and what each archive holds.

- the build prints no warning (a deprecated ``project.license`` table, a missing file, a
  ``MANIFEST.in`` line that matches nothing would each print one);
- the wheel holds ``zeroloss/`` only (with migrations, templates, static files, ``py.typed``
  and the compiled catalogs) and LICENSE, no tests;
- the sdist holds every file of the test tree, the example project, the benchmarks and the
  docs, with LICENSE and CHANGELOG.md, and its tests run from it: collected all, one run;
- the metadata: a PEP 639 license expression, extras that name what they install, no
  published ``dev`` extra, a long description without relative links, and classifiers that
  name exactly the Python and Django versions CI (``.ci/run``) installs.

Marked ``once`` (it does not depend on the database or the Django version) and
``postgres_only`` (one run is enough).
"""

from __future__ import annotations

import email
import email.policy
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

import zeroloss

pytestmark = [pytest.mark.once, pytest.mark.postgres_only]

ROOT = Path(__file__).resolve().parents[2]
NAME = f"zeroloss-{zeroloss.__version__}"
#: What is not part of the source tree (environments, caches, outputs of builds and runs).
NOT_SOURCE = (
    ".git", ".venv*", "var", "site", "build", "dist", "*.egg-info", "__pycache__", "*.py[cod]",
    ".mypy_cache", ".ruff_cache", ".pytest_cache", "test-artifacts",
)  # fmt: skip
#: Directories whose every file the sdist must hold.
SDIST_TREES = ("tests", "project", "benchmarks", "docs", "templates")


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 240) -> str:
    # PYTHONDONTWRITEBYTECODE makes setuptools warn that it skips byte-compiling.
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "DATABASE_URL")}
    result = subprocess.run(
        cmd,
        cwd=cwd,
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(cmd)} exited {result.returncode}:\n{output}"
    return output


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Build once from a copy of the tree (so nothing is written into the checkout)."""
    base = tmp_path_factory.mktemp("packaging")
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCE), symlinks=True)
    dist = base / "dist"
    output = run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), "."], source)
    (wheel,) = dist.glob("*.whl")
    (sdist,) = dist.glob("*.tar.gz")
    return {"source": source, "dist": dist, "output": output, "wheel": wheel, "sdist": sdist, "base": base}


def test_build_prints_no_warning(built: dict[str, Any]) -> None:
    assert "Successfully built" in built["output"]
    # setuptools lists every file it copies; a module's name is not a warning.
    listing = re.compile(r"^\s*(copying|adding|creating|hard linking|removing) ")
    warnings = [
        line
        for line in built["output"].splitlines()
        if re.search(r"warn|deprecat", line, re.I) and not listing.match(line)
    ]
    assert not warnings, "the build warned:\n" + "\n".join(warnings)


def test_twine_check_strict(built: dict[str, Any]) -> None:
    output = run(
        [sys.executable, "-m", "twine", "check", "--strict", str(built["wheel"]), str(built["sdist"])],
        built["base"],
    )
    assert output.count("PASSED") == 2, output


def test_wheel_holds_the_package_its_catalogs_and_license_and_no_tests(built: dict[str, Any]) -> None:
    names = zipfile.ZipFile(built["wheel"]).namelist()
    outside = [n for n in names if not n.startswith(("zeroloss/", f"{NAME}.dist-info/"))]
    assert not outside, f"the wheel holds more than zeroloss/: {outside}"
    assert not [n for n in names if "test" in n.split("/")[0] or "/tests/" in n]
    for required in (
        f"{NAME}.dist-info/licenses/LICENSE",
        "zeroloss/py.typed",
        "zeroloss/locale/de/LC_MESSAGES/django.mo",
        "zeroloss/locale/fr/LC_MESSAGES/django.mo",
        "zeroloss/migrations/0001_initial.py",
        "zeroloss/templates/zeroloss/admin/dashboard.html",
        "zeroloss/static/zeroloss/admin.css",
    ):
        assert required in names, f"the wheel has no {required}"
    migrations = {p.name for p in (ROOT / "zeroloss" / "migrations").glob("0*.py")}
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith("zeroloss/migrations/0")} == migrations
    # The statement catalogues the engines read at run time (zeroloss.ledger.catalogue).
    catalogues = {p.relative_to(ROOT).as_posix() for p in (ROOT / "zeroloss").rglob("*.sql")}
    assert catalogues, "no .sql catalogue in the source tree"
    assert catalogues <= set(names), f"the wheel has no {sorted(catalogues - set(names))}"


def _metadata(built: dict[str, Any]) -> email.message.EmailMessage:
    raw = zipfile.ZipFile(built["wheel"]).read(f"{NAME}.dist-info/METADATA").decode()
    message = email.message_from_string(raw, policy=email.policy.default)
    assert isinstance(message, email.message.EmailMessage)
    return message


def test_metadata_license_extras_and_description(built: dict[str, Any]) -> None:
    meta = _metadata(built)
    assert meta["License-Expression"] == "MIT"
    assert meta["License"] is None  # the deprecated field
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["Version"] == zeroloss.__version__
    extras = set(meta.get_all("Provides-Extra") or [])
    assert extras == {"postgres", "celery", "metrics", "otel", "tasks"}
    requires = meta.get_all("Requires-Dist") or []
    assert 'psycopg>=3.2; extra == "postgres"' in requires  # no binary build forced
    assert [r for r in requires if r.endswith('extra == "otel"')] == [
        'opentelemetry-api>=1.27; extra == "otel"'
    ]
    assert 'celery>=5.4; extra == "celery"' in requires  # no broker client forced
    assert any(r.startswith("Django") and ">=5.2" in r for r in requires)
    description = meta.get_content()
    assert meta["Description-Content-Type"].startswith("text/markdown")
    relative = re.findall(r"\]\((?![a-z]+:)([^)]*)\)", description)
    assert not relative, f"relative links on the index page: {relative}"
    assert "![" not in description and "make demo" not in description


def _ci_matrix() -> tuple[set[str], set[str]]:
    """The Python and Django minor versions ``.ci/run`` installs."""
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    pythons, djangos = set(), set()
    for line in text.splitlines():
        line = line.strip()  # a step may be indented (a continued command, a background step)
        if line.startswith("#") or not line.startswith("make test "):
            continue
        interpreter = re.search(r"PYTHON=\"?(?:python|\$py)(3\.?1\d)", line)
        django = re.search(r"DJANGO='Django>=(\d+\.\d+)", line)
        assert interpreter and django, f".ci/run: cannot read the pair of {line!r}"
        version = interpreter.group(1)
        pythons.add(version if "." in version else f"3.{version[1:]}")
        djangos.add(django.group(1))
    return pythons, djangos


def test_classifiers_name_what_ci_runs(built: dict[str, Any]) -> None:
    classifiers = _metadata(built).get_all("Classifier") or []
    pythons = {
        c.rsplit(" ", 1)[1]
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    djangos = {
        c.rsplit(" ", 1)[1] for c in classifiers if re.fullmatch(r"Framework :: Django :: \d+\.\d+", c)
    }
    ci_pythons, ci_djangos = _ci_matrix()
    assert ci_pythons == {"3.11", "3.12", "3.13"}
    assert pythons == ci_pythons
    assert djangos == ci_djangos
    assert min(ci_pythons) == "3.11"  # Requires-Python's floor is tested
    assert any(c.startswith("Development Status ::") for c in classifiers)


def test_sdist_holds_the_tests_docs_license_and_changelog(built: dict[str, Any]) -> None:
    with tarfile.open(built["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for required in ("LICENSE", "CHANGELOG.md", "README.md", "CONTRIBUTING.md", "mkdocs.yml", "manage.py", "tests/conftest.py",
                     "zeroloss/locale/de/LC_MESSAGES/django.mo", "docs/reference/index.md"):  # fmt: skip
        assert required in names, f"the sdist has no {required}"
    source = built["source"]
    expected = {
        p.relative_to(source).as_posix()
        for tree in SDIST_TREES
        for p in (source / tree).rglob("*")
        if p.is_file()
    }
    missing = sorted(expected - names)
    assert not missing, f"the sdist leaves out {missing}: add their file types to MANIFEST.in"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_sdist_runs_its_own_tests(built: dict[str, Any]) -> None:
    unpacked = built["base"] / "unpacked"
    with tarfile.open(built["sdist"]) as tar:
        tar.extractall(unpacked, filter="data")
    tree = unpacked / NAME
    env = {"PYTHONPATH": str(tree), "ZEROLOSS_VAR_DIR": str(built["base"] / "var")}
    where = run([sys.executable, "-c", "import zeroloss; print(zeroloss.__file__)"], tree, env)
    assert where.strip().startswith(str(tree)), where  # the sdist's copy, not the checkout's
    collected = run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"], tree, env
    )
    assert re.search(r"^\d+ tests collected", collected, re.M), collected[-2000:]
    ran = run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/ledger/test_translations.py",
            "-k",
            "catalog",
        ],
        tree,
        env,
    )
    assert re.search(r"\b2 passed\b", ran), ran[-2000:]
