"""Failures you can see (issue 25, point 2): a handler failure at WARNING with its traceback, a
dead letter at ERROR, a sweep's recovery and an outage at WARNING, each with structured fields;
``zeroloss_worker`` prints them on stderr by default, honours ``-v``, never prints a line twice."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from django.db import OperationalError

from tests.conftest import ROOT, child_env
from tests.support import expire_leases, register, run_worker
from zeroloss.core import outage
from zeroloss.core.outage import OutageMonitor
from zeroloss.ledger.service import ZeroLossMessageService, wait_until
from zeroloss.runtime.processing import Delivery

pytestmark = pytest.mark.django_db(transaction=True)

FIELDS = ("message_id", "queue", "attempt", "worker")


def fields(record: logging.LogRecord) -> tuple[object, ...]:
    """The structured fields every record about one message carries (docs/logging.md)."""
    return tuple(getattr(record, name) for name in FIELDS)


def records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "zeroloss" and r.levelno == level]


def test_a_handler_failure_is_a_warning_with_its_traceback_and_a_dead_letter_an_error(caplog):
    def fails(delivery: Delivery) -> None:
        raise ValueError(f"broken payload {delivery.payload['n']}")

    register("l.fails", fails)
    ZeroLossMessageService().persist_message("f1", "l.fails", {"n": 1}, max_attempts=1)
    caplog.set_level(logging.INFO, logger="zeroloss")
    _, thread = run_worker("l.fails", burst=True)
    thread.join(60)
    [failure] = records(caplog, logging.WARNING)
    assert "f1: handler" in failure.getMessage() and "ValueError: broken payload 1" in failure.getMessage()
    assert failure.exc_info is not None and failure.exc_info[0] is ValueError
    assert fields(failure)[:3] == ("f1", "l.fails", 1)
    assert str(fields(failure)[3]).endswith("/t0")
    [dead] = records(caplog, logging.ERROR)
    assert dead.getMessage().startswith(
        "f1: dead-lettered after attempt 1 of 1: ValueError: broken payload 1"
    )
    assert fields(dead)[:3] == ("f1", "l.fails", 1)


def test_a_sweep_recovery_is_a_warning_and_a_sweep_dead_letter_an_error(caplog):
    service = ZeroLossMessageService(instance_id="holder")
    service.persist_message("r1", "l.sweep", {})
    service.persist_message("r2", "l.sweep", {}, max_attempts=1)
    assert len(service.claim("l.sweep", limit=2)) == 2
    expire_leases()
    caplog.set_level(logging.INFO, logger="zeroloss")
    ZeroLossMessageService(instance_id="sweeper").sweep()
    [recovered] = records(caplog, logging.WARNING)
    assert recovered.getMessage().startswith("r1: recovered by the sweep: the lease of attempt 1 expired")
    assert fields(recovered) == ("r1", "l.sweep", 1, "holder")
    [dead] = records(caplog, logging.ERROR)
    assert dead.getMessage().startswith("r2: dead-lettered by the sweep")
    assert fields(dead) == ("r2", "l.sweep", 1, "holder")


def test_an_outage_is_a_warning(caplog):
    caplog.set_level(logging.INFO, logger="zeroloss")
    monitor = OutageMonitor("l-outage")
    monitor.failed("the test", OperationalError("connection refused"))
    monitor.recovered()
    lines = [r for r in caplog.records if r.name == "zeroloss"]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.WARNING]
    assert "unreachable since" in lines[0].getMessage() and lines[0].__dict__["database"] == "l-outage"


def test_a_storage_fault_is_logged_once_at_its_start_and_once_at_its_end(caplog):
    """A full disk refuses only the statements that need new space: the claims and renewals
    that succeed between two refusals do not end the fault (one line at its start, one at its
    end, not one per attempt), and it ends once STORAGE_FAULT_QUIET passed without a refusal."""
    caplog.set_level(logging.INFO, logger="zeroloss")
    monitor = OutageMonitor("l-storage")
    full = OperationalError('could not extend file "base/5/16384": No space left on device')
    monitor.failed("a claim", full)
    for _ in range(5):
        monitor.recovered()  # a statement that needed no new space
        monitor.failed("a transactional batch", full)
    monitor.recovered()
    assert monitor.status().startswith("database storage fault since ")
    monitor._last_storage_error -= outage.STORAGE_FAULT_QUIET  # the quiet period, by the clock it reads
    monitor.recovered()
    lines = [r.getMessage() for r in caplog.records if r.name == "zeroloss"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("database 'l-storage' storage fault since ") and "a claim retries" in lines[0]
    assert lines[1].startswith("database 'l-storage' storage writable again after ")
    assert monitor.status() == ""


def test_a_connection_the_outage_broke_found_after_its_end_is_not_a_new_outage(caplog):
    """A thread that stayed idle through a restart (a lease keeper with nothing to renew) meets
    its broken connection only after another thread ended the outage: one outage, two lines."""
    caplog.set_level(logging.INFO, logger="zeroloss")
    monitor = OutageMonitor("l-stale")
    monitor.failed("a claim", OperationalError("server closed the connection unexpectedly"))
    monitor.recovered()
    monitor.failed("the lease keeper", OperationalError("the connection is lost"))
    monitor.recovered()
    lines = [r.getMessage() for r in caplog.records if r.name == "zeroloss"]
    assert len(lines) == 2, lines
    assert monitor.status() == ""
    monitor.failed("a claim", OperationalError("connection refused"))  # a new outage is one
    assert monitor.status().startswith("database unreachable since ")


def _server_error(sqlstate: str, text: str) -> Exception:
    """The installed driver's exception for a server error of this SQLSTATE (psycopg 3, else
    psycopg2, whose errors carry their code only when the server raised them)."""
    try:
        from psycopg import errors

        return errors.lookup(sqlstate)(text)
    except ImportError:
        from psycopg2 import errors as errors2

        cls = errors2.lookup(sqlstate)
        return type(cls.__name__, (cls,), {"pgcode": sqlstate})(text)


def test_what_counts_as_a_storage_fault():
    wrapped = OperationalError("could not extend file")
    wrapped.__cause__ = _server_error("53100", "could not extend file")  # disk_full
    assert outage.is_storage_fault(wrapped)
    assert outage.is_storage_fault(sqlite3.OperationalError("database or disk is full"))
    assert outage.is_storage_fault(OSError(28, "No space left on device"))
    too_many = OperationalError("sorry, too many clients already")
    too_many.__cause__ = _server_error("53300", "sorry, too many clients already")  # also class 53
    assert not outage.is_storage_fault(too_many)
    assert not outage.is_storage_fault(OperationalError("connection refused"))


def run_command(live: ZeroLossMessageService, settings_module: str, *args: str) -> str:
    live.persist_message("c-ok", "demo.record", {})
    live.persist_message("c-bad", "demo.record", {"fail": True}, max_attempts=1)
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "zeroloss_worker",
            "--burst",
            "--queue",
            "demo.record",
            "--no-sweep",
            *args,
        ],
        cwd=ROOT,
        env=child_env(DJANGO_SETTINGS_MODULE=settings_module),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.process  # an OS process each
def test_the_worker_prints_failures_on_stderr_without_any_logging_configured(live_service):
    err = run_command(live_service, "tests.infra.settings_without_logging")
    assert err.count("WARNING zeroloss: c-bad: handler project.demo.zeroloss_handlers.record failed") == 1
    assert (
        "Traceback (most recent call last)" in err and "RuntimeError: c-bad: this message always fails" in err
    )
    assert err.count("ERROR zeroloss: c-bad: dead-lettered after attempt 1 of 1") == 1


@pytest.mark.process  # an OS process each
def test_verbosity_0_prints_errors_only(live_service):
    err = run_command(live_service, "tests.infra.settings_without_logging", "-v", "0")
    assert "WARNING zeroloss" not in err and "c-bad: handler" not in err
    assert err.count("ERROR zeroloss: c-bad: dead-lettered") == 1


@pytest.mark.process  # an OS process each
def test_the_projects_own_logging_prints_each_line_once(live_service):
    # project.settings gives the zeroloss logger a stderr handler of its own (no format).
    err = run_command(live_service, "project.settings", "-v", "2")
    assert err.count("c-bad: handler project.demo.zeroloss_handlers.record failed") == 1
    assert err.count("c-bad: dead-lettered after attempt 1 of 1") == 1
    assert "WARNING zeroloss:" not in err  # zeroloss added no handler of its own


def test_a_storage_stall_is_logged_once_at_its_start_and_once_at_its_end(caplog):
    """Commits slower than the threshold (a disk whose fsync takes seconds) log one line at the
    first, none for the next ones nor for a fast commit between them, and one once
    COMMIT_STALL_QUIET passed without a slow one (after a fast commit, or the keeper's idle tick)."""
    caplog.set_level(logging.INFO, logger="zeroloss")
    monitor = OutageMonitor("l-stall")

    def commit(seconds: float) -> None:
        ok, _ = monitor.attempt(
            lambda: time.sleep(seconds),
            who="the lease keeper",
            backoff=outage.Backoff(),
            wait=lambda s: None,
            tolerance=None,
            slow_after=0.2,
        )
        assert ok

    commit(0.0)  # fast: no stall
    commit(0.3)
    commit(0.0)  # fast, within the quiet period: the disk may stall again
    commit(0.3)
    monitor.stall_over()
    assert monitor.stalled_since is not None
    monitor._last_slow -= outage.COMMIT_STALL_QUIET  # the quiet period, by the clock it reads
    monitor.stall_over()  # the keeper's idle tick
    commit(0.0)
    lines = [r.getMessage() for r in caplog.records if r.name == "zeroloss"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("database 'l-stall' storage stalled since ")
    assert "a commit of the lease keeper took 0." in lines[0] and "(more than 0.2s)" in lines[0]
    assert lines[1].startswith("database 'l-stall' storage commits fast again after ")
    assert monitor.stalled_since is None


@pytest.mark.parametrize("timed", [True, False], ids=["timed", "watched"])
def test_a_stall_is_not_over_while_a_commit_still_waits(caplog, timed):
    """A commit is timed when it returns; one that has waited longer than COMMIT_STALL_S, and
    still waits, keeps the stall on (a stalled fsync can hold one commit past COMMIT_STALL_QUIET:
    the keeper's idle tick then logged the stall over in the middle of it). So does a commit
    that is watched but not timed (a claim's)."""
    caplog.set_level(logging.INFO, logger="zeroloss")
    monitor = OutageMonitor(f"l-waiting-{timed}")
    release = threading.Event()

    def commit(seconds: float = 0.0, block: bool = False) -> None:
        monitor.attempt(
            lambda: release.wait(30) if block else time.sleep(seconds),
            who="a claim",
            backoff=outage.Backoff(),
            wait=lambda s: None,
            tolerance=None,
            slow_after=0.2 if timed or not block else None,
            watched=not timed,
        )

    commit(0.3)  # the stall begins
    waiting = threading.Thread(target=commit, kwargs={"block": True})
    waiting.start()
    try:
        assert wait_until(lambda: len(monitor._committing) == 1, timeout=10)
        for thread in monitor._committing:  # it began long ago, by the clock the monitor reads
            monitor._committing[thread] -= outage.COMMIT_STALL_S + outage.COMMIT_STALL_QUIET
        monitor._last_slow -= outage.COMMIT_STALL_QUIET
        monitor.stall_over()  # the keeper's idle tick, the commit still waiting
        assert monitor.stalled_since is not None, "the stall was declared over while a commit waited"
    finally:
        release.set()
        waiting.join(30)
    monitor._last_slow -= outage.COMMIT_STALL_QUIET  # however long its wait took here
    monitor.stall_over()
    assert monitor.stalled_since is None  # nothing waits, the quiet period passed
    lines = [r.getMessage() for r in caplog.records if r.name == "zeroloss"]
    assert len(lines) == 2, lines
