"""Running management commands: in-process (:func:`run`, and :func:`command_line` for the
command line's own parsing and exit codes), and as a separate OS process when that process is
the point (:func:`cli`, :func:`cli_tty`: signals, a real pipe or terminal, settings read from
the environment at startup)."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from typing import Any
from unittest import mock

from django.core.management import ManagementUtility, call_command
from django.core.management.base import CommandError
from django.db import connections

from tests.support import ROOT


def _test_env() -> dict[str, str]:
    # tests.conftest imports the models: a child that imports this module has no settings yet
    from tests.conftest import child_env

    return child_env()


@dataclass
class Result:
    code: int
    out: str
    err: str


class FakeTerminal(io.StringIO):
    """Answers for the confirmation prompt, as if typed on a terminal."""

    def isatty(self) -> bool:
        return True


def run(name: str, *args: str, stdin: Any = None) -> Result:
    """``call_command`` with captured stdout/stderr; the exit code a shell would see."""
    out, err = io.StringIO(), io.StringIO()
    extra = {"stdin": stdin} if stdin is not None else {}
    try:
        call_command(name, *args, stdout=out, stderr=err, **extra)
        code = 0
    except CommandError as exc:
        err.write(str(exc))
        code = exc.returncode
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    return Result(code, out.getvalue(), err.getvalue())


def command_line(*args: str, input: str = "", tty: bool = False) -> Result:
    """``manage.py *args`` in this process: the command line's argv parsing, argparse's usage
    errors, ``<Error>: message`` on stderr and the exit code, as :func:`cli` sees them, without
    a fresh interpreter. ``input`` is stdin (a pipe, or typed on a terminal with ``tty``);
    ``tty`` also makes stdout a terminal (the progress bar)."""
    argv = ["manage.py", *args]
    terminal = FakeTerminal if tty else io.StringIO
    out, err, stdin = terminal(), io.StringIO(), terminal(input)
    code = 0
    # run_from_argv closes every connection when it ends, as a process would at exit; the
    # test's own connection (and its transaction) must outlive the command.
    with (
        redirect_stdout(out),
        redirect_stderr(err),
        mock.patch.object(sys, "stdin", stdin),
        mock.patch.object(connections, "close_all", return_value=None),
    ):
        try:
            ManagementUtility(argv).fetch_command(args[0]).run_from_argv(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return Result(code, out.getvalue(), err.getvalue())


def cli(
    *args: str, input: str | None = None, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real command line (a separate OS process), against the test database unless ``env``
    says otherwise."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=_test_env() if env is None else env,
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def cli_tty(*args: str, answer: str | None = None, timeout: float = 60) -> tuple[int, str]:
    """The command line with stdin and stdout on a pseudo-terminal; returns (exit code, output)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=_test_env(),
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    answered = answer is None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
            if not answered and b"Type 'yes'" in b"".join(chunks):
                os.write(master, answer.encode() + b"\n")  # type: ignore[union-attr]
                answered = True
        elif proc.poll() is not None:
            break
    code = proc.wait(timeout=10)
    os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """:func:`cli` in the environment ``env`` (another database, other settings)."""
    return cli(*args, timeout=timeout, env=env)
