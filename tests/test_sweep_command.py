"""``manage.py zeroloss_sweep`` as an ops script runs it: a real process, real signals."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from django.core.management import CommandError, call_command

from tests.support import expire_leases
from zeroloss.models import MessageEvent
from zeroloss.service import ZeroLossMessageService

from .conftest import ROOT, child_env

pytestmark = pytest.mark.django_db(transaction=True)


def test_sweep_once_prints_what_it_did(capsys):
    service = ZeroLossMessageService()
    service.persist_message("a", "q", {}, max_attempts=3)
    service.persist_message("b", "q", {}, max_attempts=1)  # its first expiry spends it
    assert len(service.claim_next("q", limit=2)) == 2
    expire_leases()
    call_command("zeroloss_sweep", "--json")
    out = json.loads(capsys.readouterr().out)
    assert out == {"runs": 1, "requeued": ["a"], "dead_lettered": ["b"]}
    assert MessageEvent.objects.filter(reason="lease_expired").count() == 1


def test_sweep_loop_stops_cleanly_on_sigterm():
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "zeroloss_sweep", "--loop", "--interval", "0.1"],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()  # its handlers are installed once it says it is sweeping
        assert "sweeping every" in first, first
        time.sleep(0.5)  # a few sweeps
        proc.send_signal(signal.SIGTERM)
        # It stops after the unit of work in hand, which on SQLite may wait up to the lock timeout.
        _, err = proc.communicate(timeout=60)
        err = first + err
    finally:
        if proc.poll() is None:  # never leave a hung sweeper behind a failed test
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "on SIGTERM" in err
    assert int(err.split("stopped after ")[1].split(" ")[0]) >= 2


def test_bad_arguments_exit_2():
    proc = subprocess.run(
        [sys.executable, "manage.py", "zeroloss_sweep", "--batch-size", "-3"],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "expected a whole number from 1 to 2147483647" in proc.stderr
    with pytest.raises(CommandError, match=r"(?i)unknown database alias 'nope'"):
        call_command("zeroloss_sweep", "--database", "nope")


def test_stop_flag_set_by_a_signal_mid_wait_never_blocks():
    """A signal handler runs between any two bytecodes of the main thread, including inside a
    wait; setting the flag must never take a lock that the interrupted wait might hold."""
    import os
    import random
    import threading

    from zeroloss.loops import StopFlag

    for _ in range(300):
        flag = StopFlag()
        with flag.on_signals():
            timer = threading.Timer(random.uniform(0, 0.004), os.kill, [os.getpid(), signal.SIGTERM])
            started = time.monotonic()
            timer.start()
            while not flag:
                flag.wait(0.0003)
            timer.join()
        assert flag.signal_name == "SIGTERM"
        assert time.monotonic() - started < 2
