"""``manage.py zeroloss_sweep`` as an ops script runs it: a real process, real signals."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from django.core.management import CommandError, call_command

from tests.conftest import ROOT, child_env
from tests.support import expire_leases
from tests.support.factories import make_stuck
from tests.support.processes import Proc
from tests.support.waiting import wait_for
from zeroloss.ledger.models import MessageEvent
from zeroloss.ledger.service import ZeroLossMessageService

pytestmark = pytest.mark.django_db(transaction=True)


def test_sweep_once_prints_what_it_did(capsys):
    service = ZeroLossMessageService()
    service.persist_message("a", "q", {}, max_attempts=3)
    service.persist_message("b", "q", {}, max_attempts=1)  # its first expiry spends it
    assert len(service.claim("q", limit=2)) == 2
    expire_leases()
    call_command("zeroloss_sweep", "--json")
    out = json.loads(capsys.readouterr().out)
    assert out == {"runs": 1, "requeued": ["a"], "dead_lettered": ["b"]}
    assert MessageEvent.objects.filter(reason="lease_expired").count() == 1


def test_sweep_loop_stops_cleanly_on_sigterm():
    sweeper = Proc(
        [sys.executable, "manage.py", "zeroloss_sweep", "--loop", "--interval", "0.1"], child_env()
    )
    try:
        sweeper.wait_for("sweeping every")  # its signal handlers are installed from here on

        def requeued(message_id: str) -> bool:
            return MessageEvent.objects.for_message(message_id).filter(reason="lease_expired").exists()

        # Two sweeps seen in the ledger: the second stuck message appears after the first was requeued.
        make_stuck(["s1"], expired_seconds_ago=1)
        wait_for(lambda: f"s1 requeued by a sweep:\n{sweeper.text}", lambda: requeued("s1"), 60)
        make_stuck(["s2"], expired_seconds_ago=1)
        wait_for(lambda: f"s2 requeued by a later sweep:\n{sweeper.text}", lambda: requeued("s2"), 60)
        sweeper.popen.send_signal(signal.SIGTERM)
        # It stops after the unit of work in hand, which on SQLite may wait up to the lock timeout.
        code = sweeper.wait(60)
    finally:
        sweeper.stop(signal.SIGKILL)  # never leave a hung sweeper behind a failed test
    assert code == 0, sweeper.text
    assert "on SIGTERM" in sweeper.text
    assert int(sweeper.text.split("stopped after ")[1].split(" ")[0]) >= 2


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

    from zeroloss.runtime.sweep_loop import StopFlag

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
