"""The test tiers (one folder each: tests/<tier>/, tests/conftest.py) and the Debian helper the
fixtures install with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import conftest
from tests.support import debian

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_file_sits_in_the_folder_of_a_known_tier() -> None:
    stray = sorted(
        p.relative_to(TESTS).as_posix() for p in TESTS.rglob("test_*.py") if conftest.tier_of(p) is None
    )
    assert stray == [], "a test file belongs in tests/<tier>/ (tests/conftest.py's TIER_DOCS)"
    assert {p.name for p in TESTS.iterdir() if p.is_dir() and (p / "__init__.py").exists()} >= set(
        conftest.TIER_DOCS
    )
    assert set(conftest.DJANGO_TIERS) | set(conftest.FAST_TIERS) <= set(conftest.TIER_DOCS)


class FakeItem:
    """What the collection hook reads of a pytest item."""

    def __init__(
        self, name: str, markers: tuple[str, ...] = (), fixtures: tuple[str, ...] = (), tier: str = "ledger"
    ) -> None:
        self.path = TESTS / tier / name if tier else TESTS / name
        self.nodeid = f"{self.path.relative_to(TESTS.parent).as_posix()}::test_x"
        self.fixturenames = list(fixtures)
        self.markers = [getattr(pytest.mark, m).mark for m in markers]
        self.stash = pytest.Stash()

    def iter_markers(self) -> Any:
        return iter(self.markers)

    def get_closest_marker(self, name: str) -> Any:
        return next((m for m in self.markers if m.name == name), None)

    def add_marker(self, marker: Any) -> None:
        self.markers.append(marker.mark)


def collect(*items: FakeItem) -> None:
    conftest.pytest_collection_modifyitems(None, list(items))  # type: ignore[arg-type]


def test_an_untiered_file_fails_collection_saying_how_to_tier_it() -> None:
    with pytest.raises(pytest.UsageError) as caught:
        collect(FakeItem("test_brand_new.py", tier=""))
    message = str(caught.value)
    assert message.startswith(
        "test_brand_new.py has no test tier: move it to the folder of the lightest tier"
    )
    for tier in conftest.TIER_DOCS:
        assert f"    {tier}: " in message


def test_a_file_gives_its_tier_a_test_may_carry_its_own_and_non_django_tiers_run_once() -> None:
    ledger, own = FakeItem("test_service.py"), FakeItem("test_service.py", markers=("process",))
    collect(ledger, own)
    assert [m.name for m in ledger.markers] == ["ledger"]
    assert [m.name for m in own.markers] == ["process", "process", "once"]


def test_a_unit_test_that_asks_for_a_database_and_a_test_with_two_tiers_are_refused() -> None:
    with pytest.raises(
        pytest.UsageError, match=r"uses a database but its tier is unit: mark it @pytest.mark.ledger"
    ):
        collect(FakeItem("test_import_cycles.py", fixtures=("db",), tier="unit"))
    with pytest.raises(pytest.UsageError, match=r"has several tier markers \(ledger, process\): keep one"):
        collect(FakeItem("test_service.py", markers=("ledger", "process")))


def test_a_unit_test_cannot_start_an_os_process() -> None:
    import subprocess
    import sys

    with pytest.raises(
        AssertionError, match=r"\(tier unit\) started an OS process: mark it @pytest.mark.process"
    ):
        subprocess.run([sys.executable, "-c", "pass"], check=False)


def test_a_missing_package_without_root_or_apt_is_a_failure_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    debian.ensure_debian_package("python3", [__file__])  # present: nothing to do, no apt
    monkeypatch.setattr(debian.os, "geteuid", lambda: 1000)
    with pytest.raises(debian.DebianPackageError) as caught:
        debian.ensure_debian_package("zeroloss-absent", ["/nonexistent/zeroloss-absent"])
    assert str(caught.value) == (
        "/nonexistent/zeroloss-absent not found and installing zeroloss-absent needs root; "
        "install it by hand: apt-get install zeroloss-absent"
    )
    monkeypatch.setattr(debian.os, "geteuid", lambda: 0)
    monkeypatch.setattr(debian.shutil, "which", lambda name: None)
    with pytest.raises(
        debian.DebianPackageError,
        match=r"there is no apt-get; install it by hand: apt-get install zeroloss-absent",
    ):
        debian.ensure_debian_package("zeroloss-absent", ["/nonexistent/zeroloss-absent"])
