"""``zeroloss_verify``: bounded memory, never a write, severity from codes (issues 15, 17.7, 18.12)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import pytest
from django.db import connection

from tests.conftest import ROOT, child_env
from tests.support.cli import run
from tests.support.factories import clear_cache, copy_stored_messages, ledger_state, make_stuck
from tests.support.waiting import wait_for
from zeroloss.ledger.models import Message
from zeroloss.ledger.service import WARNING, IntegrityFinding, IntegrityReport, ZeroLossMessageService
from zeroloss.management import verify as verify_checks
from zeroloss.management.batches import BATCH_PAYLOAD_BYTES, PayloadBatches

#: ~1,000 messages of ~200 KiB: 200 MiB of payload. Fetched 2,000 rows at a time (before issue
#: 17.7) the whole ledger was in memory at once: about 0.9 GiB peak.
MESSAGES = 1_000
SEEDED = 50
PAYLOAD_CHARS = 200 * 1024
#: The stated bound on a full run's peak RSS: the interpreter with Django (~70 MiB) plus a
#: batch of at most BATCH_PAYLOAD_BYTES (32 MiB) of JSON text, as text and as parsed objects.
PEAK_RSS_BOUND = 256 * 2**20


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def run_measured(*args: str, timeout: float = 600) -> tuple[int, int, str, str]:
    """(exit code, peak RSS in bytes, stdout, stderr) of ``manage.py ARGS``, measured by the kernel.

    The child is reaped with ``os.wait4``, which returns that one child's resource usage
    (``RUSAGE_CHILDREN`` would mix in every other child this test process ever had).
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )

        def reaped() -> Any:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                return usage
            return None

        try:
            usage = wait_for(f"manage.py {args} exited", reaped, timeout)
        finally:
            if proc.returncode is None:
                proc.kill()
                proc.wait(timeout=10)
        out.seek(0)
        err.seek(0)
        return proc.returncode, usage.ru_maxrss * 1024, out.read().decode(), err.read().decode()  # KiB


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_full_run_memory_is_bounded_by_bytes_not_rows():
    # 50 stored as any send stores them, then copied in the database (seconds, not a minute):
    # the verifier reads 1,000 rows of 200 KiB of JSON text whatever they repeat. A blob that
    # repeats its random start is compressed where it is stored (little to write, to copy) and
    # is read back whole.
    ZeroLossMessageService().persist_messages(
        [
            (f"big-{i}", "big", {"i": i, "blob": os.urandom(32).hex() * (PAYLOAD_CHARS // 64)})
            for i in range(SEEDED)
        ]
    )
    for copy in range(1, MESSAGES // SEEDED):
        assert copy_stored_messages("big-", f"copy{copy}-") == SEEDED
    code, peak, out, err = run_measured("zeroloss_verify", "--json", "-v", "2")
    assert code == 0, err
    data = json.loads(out)
    assert data["integrity"]["messages_checked"] == MESSAGES
    assert data["status"] == "ok"
    # 200 MiB of payload went through in batches of at most BATCH_PAYLOAD_BYTES.
    assert "MiB of payload (bound 32 MiB)" in err
    assert peak < PEAK_RSS_BOUND, f"peak RSS {peak / 2**20:.0f} MiB, bound {PEAK_RSS_BOUND / 2**20:.0f} MiB"
    print(f"zeroloss_verify over {MESSAGES} x {PAYLOAD_CHARS // 1024} KiB: peak RSS {peak / 2**20:.0f} MiB")


@pytest.mark.django_db
def test_batches_hold_at_most_the_byte_bound():
    service = ZeroLossMessageService()
    service.persist_messages([(f"m{i}", "q", {"blob": "x" * 1000}) for i in range(10)])
    service.persist_message("huge", "q", {"blob": "y" * 5000})
    batches = PayloadBatches(service, max_bytes=3_500)
    got = [[m.message_id for m in batch] for batch in batches.batches(batches.all_sizes())]
    # 1,012 bytes of JSON each: three fit under 3,500; a payload above the bound comes alone.
    assert got == [["m0", "m1", "m2"], ["m3", "m4", "m5"], ["m6", "m7", "m8"], ["m9"], ["huge"]]
    assert batches.count == 5
    assert 5000 < batches.largest < 5100
    assert [m.message_id for b in batches.batches(batches.sizes_of([1, 2])) for m in b] == [
        m.message_id for m in Message.objects.filter(pk__in=[1, 2]).order_by("id")
    ]
    assert BATCH_PAYLOAD_BYTES == 32 * 2**20


@pytest.mark.django_db(transaction=True)
def test_replication_check_never_writes():
    service = ZeroLossMessageService()
    service.persist_messages([("m1", "q", {"a": 1}), ("m2", "q", {"b": 2})])
    assert list(Message.objects.values_list("commit_lsn", flat=True)) == [None, None]
    before = ledger_state()
    r = run("zeroloss_verify", "--replication", "--json")
    assert r.code == 0, r
    assert json.loads(r.out)["integrity"]["replication_checked"] is True
    # Before issue 18.12 the first measurement recorded commit_lsn on PostgreSQL.
    assert ledger_state() == before
    assert connection.vendor in ("postgresql", "sqlite")


@pytest.mark.django_db
def test_severity_comes_from_the_code_not_the_text(monkeypatch):
    make_stuck(["s1"])

    def verify(self, message, now=None, *, replication=True, record=True):
        # A warning code whose text looks alarming: the verdict follows the code.
        finding = IntegrityFinding("stuck", WARNING, "CRITICAL: checksum mismatch (not really)")
        return IntegrityReport(message.message_id, False, [finding], message.status)

    monkeypatch.setattr(ZeroLossMessageService, "verify_message", verify)
    r = run("zeroloss_verify", "--json")
    data = json.loads(r.out)
    assert (r.code, data["status"], data["issue_counts"]) == (1, "warning", {"stuck": 1})

    def unknown(self, message, now=None, *, replication=True, record=True):
        finding = IntegrityFinding("future_check", "critical", "a check this command does not know yet")
        return IntegrityReport(message.message_id, False, [finding], message.status)

    monkeypatch.setattr(ZeroLossMessageService, "verify_message", unknown)
    r = run("zeroloss_verify", "--json")
    assert (r.code, json.loads(r.out)["issues"][0]["severity"]) == (2, "critical")


def test_every_code_the_command_emits_has_a_severity():
    codes = {"orphan_event", "missing_persisted_event", "duplicate_persisted_event", "status_mismatch"}
    codes |= {"unbalanced", "dead_letters", "replication_requirement", "disallowed_transition"}
    codes |= {"workflow_step_stranded", "workflow_step_released_early"}
    codes |= set(verify_checks._INTEGRITY_CODES)
    assert codes == set(verify_checks.SEVERITY)


@pytest.mark.django_db(transaction=True)
def test_an_audit_row_off_the_state_machine_is_critical():
    from zeroloss.ledger.models import MessageEvent

    service = ZeroLossMessageService(instance_id="w")
    service.persist_message("m1", "q", {})
    lease = service.claim_message("m1")
    assert lease and service.acknowledge("m1", lease.token)
    assert json.loads(run("zeroloss_verify", "--json").out)["status"] == "ok"
    # A row no transition writes: completed straight back to pending, "claimed".
    event = MessageEvent.objects.for_message("m1").last()
    assert event is not None
    MessageEvent.objects.create(
        message=event.message,
        from_status="completed",
        to_status="completed",
        reason="claimed",
        actor="forger",
        attempt=1,
        created_at=event.created_at,
        message_created_at=event.message_created_at,
    )
    result = run("zeroloss_verify", "--json")
    assert result.code == 2
    data = json.loads(result.out)
    [issue] = [i for i in data["issues"] if i["check"] == "disallowed_transition"]
    assert issue["severity"] == "critical" and "completed -> completed (claimed)" in issue["detail"]
