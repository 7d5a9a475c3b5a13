"""Ops commands under faults and at the edges (issues 17.6, 17.9, 18.3, 15).

- a database that is really not there (nothing listens on the port, or a SQLite file that
  cannot be opened): exit code 4, one line on stderr, a JSON error document with ``--json``;
- stdout closed by its reader (``| head -1``): exit 141, nothing on stderr;
- durations and seconds that cannot be represented: usage errors (exit 2), nothing changed;
- ``--verbosity`` 0/1/2 and the parser every command builds.

Separate processes stay for the unreachable database (``ZEROLOSS_EXTRA_DATABASES`` is read at
startup) and the closed pipe (a real OS pipe); the rest runs the command line in-process.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from django.core.management import get_commands, load_command_class

from tests.conftest import ROOT, child_env
from tests.support.cli import cli, command_line, run
from tests.support.factories import clear_cache, ledger_state, make_completed, make_dead, make_stuck
from zeroloss.management.base import (
    EXIT_BROKEN_PIPE,
    EXIT_UNREACHABLE,
    LedgerUnreachable,
    UsageError,
    ZeroLossParser,
)

OPS_COMMANDS = ["zeroloss_status", "zeroloss_verify", "zeroloss_requeue", "zeroloss_purge", "zeroloss_nodes"]
#: Each command with arguments that make it reach for the ledger.
REACHING = {
    "zeroloss_status": [],
    "zeroloss_verify": [],
    "zeroloss_requeue": ["--queue", "q", "--state", "dead", "--yes"],
    "zeroloss_purge": ["--older-than", "1d", "--yes"],
    "zeroloss_nodes": ["list"],
}
ERROR_KEYS = {"status", "error", "error_type", "command", "database", "exit_code"}


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def free_loopback_port() -> int:
    """A loopback port nothing listens on (bound and released: connecting is refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=["postgresql", "sqlite"])
def unreachable_url(request, tmp_path) -> str:
    if request.param == "postgresql":
        return f"postgres://postgres@127.0.0.1:{free_loopback_port()}/zeroloss_nowhere"
    return f"sqlite:///{tmp_path}/no-such-directory/ledger.sqlite3"  # cannot be opened


def manage(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """The command line with these environment variables on top of the test's."""
    return cli(*args, timeout=timeout, env=child_env(**env))


# -- an unreachable ledger ----------------------------------------------------------------


@pytest.mark.parametrize("name", OPS_COMMANDS)
def test_unreachable_database_is_exit_4_with_one_line(name, unreachable_url):
    extra = json.dumps({"extra": unreachable_url})
    plain = manage(name, *REACHING[name], "--database", "extra", ZEROLOSS_EXTRA_DATABASES=extra)
    assert plain.returncode == EXIT_UNREACHABLE == 4, plain.stderr
    assert "Traceback" not in plain.stderr
    lines = plain.stderr.splitlines()
    assert len(lines) == 1, plain.stderr
    assert lines[0].startswith("LedgerUnreachable: could not reach the ledger (database 'extra'): ")
    assert "OperationalError" in lines[0]
    assert plain.stdout == ""

    as_json = manage(name, *REACHING[name], "--database", "extra", "--json", ZEROLOSS_EXTRA_DATABASES=extra)
    assert as_json.returncode == 4, as_json.stderr
    assert len(as_json.stderr.splitlines()) == 1 and "Traceback" not in as_json.stderr
    document = json.loads(as_json.stdout)
    assert set(document) == ERROR_KEYS
    assert document["status"] == "error"
    assert (document["command"], document["database"], document["exit_code"]) == (name, "extra", 4)
    assert document["error_type"] == "OperationalError"
    assert document["error"] == lines[0].removeprefix("LedgerUnreachable: ")
    assert "\n" not in as_json.stdout.strip()  # one line, for --watch readers too


def test_call_command_callers_get_the_code():
    # call_command raises it; its returncode is what the command line exits with.
    assert LedgerUnreachable("x").returncode == EXIT_UNREACHABLE


# -- stdout closed by its reader -----------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("as_json", [True, False])
def test_watch_into_head_stops_quietly(as_json):
    make_dead(["d1"])
    status = subprocess.Popen(
        [sys.executable, "manage.py", "zeroloss_status", "--watch", "0.05", *(["--json"] if as_json else [])],
        cwd=ROOT,
        env=child_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    head = subprocess.Popen(["head", "-1"], stdin=status.stdout, stdout=subprocess.PIPE)
    assert status.stdout is not None and status.stderr is not None
    status.stdout.close()  # head holds the only read end: when it exits, the pipe breaks
    try:
        first, _ = head.communicate(timeout=60)
        code = status.wait(timeout=60)
        err = status.stderr.read().decode()
    finally:
        for proc in (status, head):
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        status.stderr.close()
    assert code == EXIT_BROKEN_PIPE == 141, err
    assert err == ""
    assert len(first.splitlines()) == 1
    if as_json:
        assert json.loads(first)["dead"] == 1


# -- values that cannot be represented ----------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args",
    [
        ["zeroloss_purge", "--older-than", "999999d", "--yes"],
        ["zeroloss_purge", "--older-than", "365001d", "--yes"],
        ["zeroloss_purge", "--older-than", "9" * 400 + "s", "--yes"],  # float("9...9") is inf
        ["zeroloss_requeue", "--queue", "q", "--state", "dead", "--older-than", "999999d", "--yes"],
        ["zeroloss_requeue", "--queue", "q", "--state", "stuck", "--older-than", "1e9d", "--yes"],
    ],
)
def test_durations_beyond_representable_are_usage_errors(args):
    make_dead(["d1"])
    make_completed(["c1"])
    before = ledger_state()
    r = run(*args)
    assert r.code == 2, r
    assert "invalid duration" in r.err
    assert ledger_state() == before


@pytest.mark.django_db
def test_longest_duration_is_accepted():
    make_completed(["c1"])
    r = run("zeroloss_purge", "--older-than", "365000d", "--yes", "--json")
    assert r.code == 0, r
    assert json.loads(r.out)["matched"] == 0


@pytest.mark.django_db
def test_overflowing_duration_on_the_command_line():
    make_dead(["d1"])
    before = ledger_state()
    for args in (
        ["zeroloss_purge", "--older-than", "999999d", "--yes"],
        ["zeroloss_requeue", "--queue", "q", "--state", "dead", "--older-than", "999999d", "--yes"],
    ):
        r = command_line(*args)
        assert r.code == 2, r.err
        assert "error: argument --older-than: invalid duration '999999d': at most 365000d" in r.err
        assert "Traceback" not in r.err
    assert ledger_state() == before


@pytest.mark.parametrize(
    ("command", "option"),
    [
        ("zeroloss_status", "--watch"),
        ("zeroloss_sweep", "--interval"),
        ("zeroloss_worker", "--poll-interval"),
    ],
)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e999", "Infinity"])
def test_seconds_must_be_finite(command, option, value):
    parser = load_command_class(get_commands()[command], command).create_parser("manage.py", command)
    with pytest.raises(UsageError, match=f"invalid number '{value}': expected finite seconds > 0"):
        parser.parse_args([f"{option}={value}"])
    assert parser.parse_args([option, "0.5"]).__dict__[option.lstrip("-").replace("-", "_")] == 0.5


# -- verbosity and the parser --------------------------------------------------------------


@pytest.mark.django_db
class TestVerbosity:
    def test_status(self):
        make_dead(["d1"])
        default = run("zeroloss_status").out
        quiet = run("zeroloss_status", "-v", "0").out
        loud = run("zeroloss_status", "--verbosity", "2", "--no-cache").out
        assert "nodes: 0 live" in default and "as of " in default
        assert quiet.splitlines() == default.splitlines()[:3]  # the table, nothing else
        assert loud.startswith(default.split("as of ")[0])
        assert "snapshot: read from the database in " in loud and "completed counts exact" in loud

    def test_requeue_lists_every_id_only_when_asked(self):
        ids = [f"d{i:02d}" for i in range(60)]
        make_dead(ids)
        dry = run("zeroloss_requeue", *ids, "--dry-run")
        assert "... and 10 more" in dry.out
        assert "d59" not in dry.out
        loud = run("zeroloss_requeue", *ids, "--dry-run", "-v", "2")
        assert all(i in loud.out for i in ids)
        quiet = run("zeroloss_requeue", *ids, "--dry-run", "-v", "0")
        assert quiet.out.splitlines() == ["would requeue 60 of 60 selected message(s)"]

    def test_verify(self):
        make_stuck(["s1"])
        default = run("zeroloss_verify")
        quiet = run("zeroloss_verify", "-v", "0")
        loud = run("zeroloss_verify", "-v", "2")
        assert (default.code, quiet.code, loud.code) == (1, 1, 1)
        assert "conservation:" in default.out and "conservation:" not in quiet.out
        assert quiet.out.startswith("zeroloss_verify: WARNING\n\nseverity")
        assert "s1" in quiet.out
        assert "zeroloss_verify: integrity " in loud.err and "MiB of payload" in loud.err
        assert "zeroloss_verify: integrity " not in default.err

    def test_purge_logs_batches_at_2(self):
        make_completed(["c1", "c2", "c3"])
        loud = run("zeroloss_purge", "--older-than", "0s", "--batch-size", "2", "--yes", "-v", "2")
        assert loud.code == 0
        assert loud.err.count("zeroloss_purge: batch of ") == 2
        quiet = run("zeroloss_purge", "--older-than", "0s", "--yes", "-v", "0")
        assert quiet.out.startswith("purged 0 completed message(s)")
        assert quiet.err == ""


@pytest.mark.django_db
def test_no_progress_bar_at_verbosity_0():
    make_completed([f"c{i}" for i in range(30)])
    args = ("zeroloss_purge", "--older-than", "0s", "--batch-size", "10", "-v", "0")
    r = command_line(*args, input="yes\n", tty=True)
    assert r.code == 0, r.err
    assert "purge [" not in r.out
    assert "purged 30 completed message(s)" in r.out


@pytest.mark.parametrize("name", OPS_COMMANDS)
def test_every_command_builds_a_zeroloss_parser(name):
    command = load_command_class(get_commands()[name], name)
    parser = command.create_parser("manage.py", name)
    assert isinstance(parser, ZeroLossParser)
    options = {a.dest for a in parser._actions}
    assert {"help", "verbosity", "settings", "traceback", "database", "json"} <= options
    # Django's own options come from its parser (argparse "parents"), exactly once each.
    flags = [f for a in parser._actions for f in a.option_strings]
    assert len(flags) == len(set(flags))


@pytest.mark.django_db
def test_help_on_the_command_line():
    r = command_line("zeroloss_status", "--help")
    assert r.code == 0, r.err
    assert "usage: manage.py zeroloss_status" in r.out
    assert "--database DATABASE" in r.out and "--verbosity" in r.out and "--watch SECONDS" in r.out
