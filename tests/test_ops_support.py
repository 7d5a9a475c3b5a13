"""Helpers shared by the tests/test_ops_*.py modules (no tests here)."""

from __future__ import annotations

import datetime as dt
import io
import os
import pty
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from django.core.cache import caches
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from tests.conftest import ROOT, child_env
from zeroloss.models import Message, MessageEvent, PurgeRecord
from zeroloss.service import ZeroLossMessageService


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
    return Result(code, out.getvalue(), err.getvalue())


def cli(*args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The real command line against the test database (a separate OS process)."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=child_env(),
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
        env=child_env(),
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


def ledger_state(using: str = "default") -> tuple[Any, ...]:
    """Every row a command could change, to assert that it changed nothing."""
    return (
        list(Message.objects.using(using).order_by("id").values()),
        list(MessageEvent.objects.using(using).order_by("id").values()),
        list(PurgeRecord.objects.using(using).order_by("id").values()),
    )


def clear_cache() -> None:
    caches["default"].clear()


def make_stuck(ids: list[str], queue: str = "q") -> None:
    """Processing messages whose lease expired (a worker that died holding them).

    The lease is expired by moving ``lease_expires_at`` into the past, never by waiting.
    """
    worker = ZeroLossMessageService(instance_id="dead-worker")
    worker.persist_messages([(m, queue, {"id": m}) for m in ids])
    for m in ids:
        assert worker.mark_processing(m)
    expired = Message.objects.filter(message_id__in=ids).update(
        lease_expires_at=timezone.now() - dt.timedelta(minutes=1)
    )
    assert expired == len(ids)


def make_dead(ids: list[str], queue: str = "q") -> None:
    """Dead letters: one attempt allowed, and it failed."""
    worker = ZeroLossMessageService(instance_id="failing-worker")
    worker.persist_messages([(m, queue, {"id": m}) for m in ids], max_attempts=1)
    for m in ids:
        lease = worker.mark_processing(m)
        assert lease
        assert worker.mark_failed(m, lease.token, "boom")


def make_leased(ids: list[str], queue: str = "q") -> dict[str, Any]:
    """Processing messages under a live (60 s) lease; returns the tokens."""
    worker = ZeroLossMessageService(ack_timeout=60, instance_id="live-worker")
    worker.persist_messages([(m, queue, {"id": m}) for m in ids])
    tokens = {}
    for m in ids:
        lease = worker.mark_processing(m)
        assert lease
        tokens[m] = lease.token
    return tokens


def make_completed(ids: list[str], queue: str = "q") -> None:
    worker = ZeroLossMessageService(instance_id="good-worker")
    worker.persist_messages([(m, queue, {"id": m}) for m in ids])
    for m in ids:
        lease = worker.mark_processing(m)
        assert lease
        assert worker.acknowledge_message(m, lease.token)


def statuses(using: str = "default") -> dict[str, str]:
    return dict(Message.objects.using(using).values_list("message_id", "status"))
