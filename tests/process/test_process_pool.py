"""``zeroloss_worker --pool process`` (issue 27, part C): real worker processes whose handlers
run in spawned child processes. Messages drain with their outcomes batched by the parent; a
hung handler is killed at its hard limit and a new child goes on; the soft limit is raised in
the child; ``--max-tasks-per-child`` recycles children; a child that dies fails its message
once; a SIGKILLed parent takes its children with it and the sweep recovers the leases once.

The handlers are in ``tests/infra/timelimits_app`` (installed in the workers with
``ZEROLOSS_EXTRA_APPS``); each run writes a ``HandledRecord`` whose ``worker`` is
``<what>:<pid>`` — the child's own record of what it did.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

import tests.infra.timelimits_app.zeroloss_handlers  # noqa: F401  (the same queues in this process)
from project.demo.models import HandledRecord
from tests.support import expire_leases
from tests.support.processes import Proc, db_worker, wait_until_other_sessions_gone
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def pool_worker(*args: str, **env: str) -> Proc:
    return db_worker(
        "--pool",
        "process",
        "--poll-interval",
        "0.1",
        *args,
        ZEROLOSS_EXTRA_APPS="tests.infra.timelimits_app",
        **env,
    )


def drained(worker: Proc, timeout: float = 180) -> None:
    try:
        assert worker.popen.wait(timeout=timeout) == 0, worker.text
    finally:
        worker.terminate()


def records(what: str | None = None) -> list[tuple[str, str, int]]:
    """(message id, what, child pid) of every handler run on record."""
    rows = []
    for mid, worker in HandledRecord.objects.order_by("id").values_list("message_id", "worker"):
        kind, _, pid = worker.partition(":")
        if what is None or kind == what:
            rows.append((mid, kind, int(pid)))
    return rows


def statuses() -> dict[str, str]:
    return dict(Message.objects.values_list("message_id", "status"))


def spawned_children(parent: int) -> list[int]:
    """Live processes whose parent is ``parent`` and that run multiprocessing's spawn_main."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        state, ppid = text[text.rfind(")") + 2 :].split()[:2]
        if int(ppid) == parent and state != "Z" and b"spawn_main" in cmdline:
            found.append(int(stat.parent.name))
    return found


def test_messages_drain_in_child_processes_with_their_outcomes_batched():
    ZeroLossMessageService().persist_messages([(f"r{i:02d}", "tl.record", {}) for i in range(60)])
    # Claims sized to 1 s of work, however slow a loaded machine makes each message: the
    # outcomes of a claim are recorded together, with the next claim.
    worker = pool_worker(
        "--queue",
        "tl.record",
        "--concurrency",
        "2",
        "--burst",
        ZEROLOSS_SETTINGS_JSON='{"ACK_FLUSH_INTERVAL": 1}',
    )
    drained(worker)
    runs = records("ran")
    assert sorted(mid for mid, _, _ in runs) == [f"r{i:02d}" for i in range(60)]  # each once
    pids = {pid for _, _, pid in runs}
    assert worker.popen.pid not in pids and 1 <= len(pids) <= 2  # in the children, not the parent
    assert set(statuses().values()) == {Status.COMPLETED}
    # Recorded by the parent in batches: the 60 acknowledgements share far fewer statements.
    stamps = set(MessageEvent.objects.filter(reason="acknowledged").values_list("created_at", flat=True))
    assert len(stamps) < 30


def test_a_hung_handler_is_killed_at_its_hard_limit_and_a_new_child_runs_the_next_messages():
    service = ZeroLossMessageService()
    service.persist_message("h0", "tl.hang", {"hang": True}, max_attempts=1)
    service.persist_messages([(f"h{i}", "tl.hang", {}) for i in range(1, 6)])
    worker = pool_worker("--queue", "tl.hang", "--concurrency", "1", "--burst")
    drained(worker)
    hung = Message.objects.get(message_id="h0")
    assert hung.status == Status.DEAD
    assert hung.last_error.startswith("zeroloss.exceptions.TimeLimitExceeded: handler ")
    assert "ran past its hard time limit (1s" in hung.last_error
    assert {mid: s for mid, s in statuses().items() if mid != "h0"} == dict.fromkeys(
        [f"h{i}" for i in range(1, 6)], Status.COMPLETED
    )
    [(_, _, hung_pid)] = [r for r in records("started") if r[0] == "h0"]
    later = {pid for mid, _, pid in records("ran")}
    assert hung_pid not in later  # the killed child's slot went to a new one
    # Killed at its limit (1 s), measured from its own start to the recorded failure.
    started = HandledRecord.objects.get(message_id="h0", worker__startswith="started").handled_at
    failed = MessageEvent.objects.for_message("h0").get(reason="dead_lettered").created_at
    assert 0.9 <= (failed - started).total_seconds() < 1 + 10, (started, failed)


def test_the_soft_limit_is_raised_in_the_child_for_sync_and_async_handlers():
    service = ZeroLossMessageService()
    service.persist_message("s-caught", "tl.soft", {})
    service.persist_message("s-raised", "tl.soft_raise", {}, max_attempts=1)
    service.persist_message("s-async", "tl.async_soft", {})
    started = time.monotonic()
    worker = pool_worker(
        "--queue", "tl.soft", "--queue", "tl.soft_raise", "--queue", "tl.async_soft", "--burst"
    )
    drained(worker)
    assert time.monotonic() - started < 60  # none slept its 60 s
    assert statuses() == {"s-caught": Status.COMPLETED, "s-raised": Status.DEAD, "s-async": Status.COMPLETED}
    assert Message.objects.get(message_id="s-raised").last_error.startswith(
        "zeroloss.exceptions.SoftTimeLimitExceeded"
    )
    assert sorted(mid for mid, _, _ in records("soft")) == ["s-async", "s-caught"]


def test_max_tasks_per_child_recycles_children_and_loses_nothing():
    ZeroLossMessageService().persist_messages([(f"m{i:02d}", "tl.record", {}) for i in range(12)])
    worker = pool_worker(
        "--queue", "tl.record", "--concurrency", "1", "--max-tasks-per-child", "3", "--burst"
    )
    drained(worker)
    runs = records("ran")
    assert sorted(mid for mid, _, _ in runs) == [f"m{i:02d}" for i in range(12)]
    per_child = collections.Counter(pid for _, _, pid in runs)
    assert len(per_child) == 4 and set(per_child.values()) == {3}, per_child
    assert set(statuses().values()) == {Status.COMPLETED}


def test_a_child_that_exits_fails_its_message_once_and_the_worker_goes_on():
    service = ZeroLossMessageService()
    service.persist_message("e0", "tl.exit", {"exit": True})
    service.persist_messages([(f"e{i}", "tl.exit", {}) for i in range(1, 5)])
    worker = pool_worker("--queue", "tl.exit", "--concurrency", "1", "--burst")
    drained(worker)
    assert set(statuses().values()) == {Status.COMPLETED}
    died = Message.objects.get(message_id="e0")
    assert died.attempts == 2  # its first attempt failed with the child, the retry completed
    [failure] = MessageEvent.objects.for_message("e0").filter(reason="failed")
    assert (
        "zeroloss.runtime.worker.pool.ChildDied" in failure.detail and "exited with code 3" in failure.detail
    )
    assert collections.Counter(mid for mid, _, _ in records("ran")) == dict.fromkeys(
        [f"e{i}" for i in range(5)], 1
    )
    assert set(Message.objects.exclude(message_id="e0").values_list("attempts", flat=True)) == {1}


def test_sigkill_of_the_parent_takes_its_children_and_the_sweep_recovers_each_lease_once():
    service = ZeroLossMessageService()
    service.persist_messages([("k0", "tl.forever", {}), ("k1", "tl.forever", {})])
    worker = pool_worker("--queue", "tl.forever", "--concurrency", "2", "--batch-size", "1", "--no-sweep")
    try:
        assert wait_until(lambda: len(records("started")) == 2, timeout=120), worker.text
        children = spawned_children(worker.popen.pid)
        assert len(children) == 2, children
        os.kill(worker.popen.pid, signal.SIGKILL)  # the parent only: its children must follow
        worker.popen.wait(timeout=10)
        assert wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), timeout=20), (
            f"children {children} outlived their parent"
        )
        wait_until_other_sessions_gone()
    finally:
        worker.terminate()
    assert statuses() == {"k0": Status.PROCESSING, "k1": Status.PROCESSING}
    expire_leases()
    assert sorted(service.sweep().requeued) == ["k0", "k1"]
    assert service.sweep().total == 0  # exactly once
    assert statuses() == {"k0": Status.PENDING, "k1": Status.PENDING}
    assert set(Message.objects.values_list("attempts", flat=True)) == {1}


def test_transactional_handlers_are_refused_with_the_process_pool():
    worker = db_worker("--pool", "process", "--queue", "demo.record_tx", "--burst")
    assert worker.popen.wait(timeout=60) == 2
    worker.terminate()
    assert "--pool process cannot run transactional handlers: 'demo.record_tx'" in worker.text


def test_max_tasks_per_child_without_the_process_pool_is_a_usage_error():
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError) as caught:
        call_command("zeroloss_worker", "--queue", "demo.record", "--max-tasks-per-child", "3", "--burst")
    assert caught.value.returncode == 2
    assert str(caught.value) == "--max-tasks-per-child needs --pool process."
    assert not Message.objects.exists()


def test_a_child_killed_while_idle_is_replaced_before_the_next_message():
    service = ZeroLossMessageService()
    service.persist_message("i0", "tl.record", {})
    worker = pool_worker("--queue", "tl.record", "--concurrency", "1", "--no-sweep")
    try:
        assert wait_until(lambda: Message.objects.get(message_id="i0").status == Status.COMPLETED, 120), (
            worker.text
        )
        [child] = spawned_children(worker.popen.pid)
        os.kill(child, signal.SIGKILL)  # the OOM killer, between messages
        assert wait_until(lambda: not spawned_children(worker.popen.pid), timeout=20)
        service.persist_message("i1", "tl.record", {})
        assert wait_until(lambda: Message.objects.get(message_id="i1").status == Status.COMPLETED, 120), (
            worker.text
        )
    finally:
        assert worker.terminate() == 0, worker.text
    [(_, _, first), (_, _, second)] = records("ran")
    assert first == child and second != child
    assert Message.objects.get(message_id="i1").attempts == 1  # nothing was charged for the dead child


def test_a_handler_that_ignores_its_soft_limit_is_killed_at_its_hard_limit():
    ZeroLossMessageService().persist_message("st", "tl.stubborn", {}, max_attempts=1)
    worker = pool_worker("--queue", "tl.stubborn", "--burst")
    drained(worker)
    [(_, _, pid)] = records("soft")  # the soft limit had its chance first, in the child
    message = Message.objects.get(message_id="st")
    assert message.status == Status.DEAD
    assert message.last_error.startswith("zeroloss.exceptions.TimeLimitExceeded")
    assert f"its child process {pid} was killed" in message.last_error


def test_a_frozen_worker_woken_after_its_lease_was_taken_over_kills_its_child_at_once():
    # Its whole process group SIGSTOPped while its handler runs; meanwhile the lease runs out
    # (moved into the past), the sweep puts the message back and another claim takes it. Woken,
    # the worker kills the child still running the old run: the two overlap only until then.
    service = ZeroLossMessageService()
    service.persist_messages([("fz0", "tl.forever", {})])
    worker = pool_worker("--queue", "tl.forever", "--concurrency", "1", "--batch-size", "1", "--no-sweep")
    try:
        assert wait_until(lambda: len(records("started")) == 1, timeout=120), worker.text
        [child] = spawned_children(worker.popen.pid)
        os.killpg(worker.popen.pid, signal.SIGSTOP)
        assert expire_leases(["fz0"]) == 1
        assert service.sweep().requeued == ["fz0"]
        assert service.claim("tl.forever")  # the next run's claim: the message is its now
        woken = time.monotonic()
        os.killpg(worker.popen.pid, signal.SIGCONT)
        gone = wait_until(lambda: not Path(f"/proc/{child}").exists() or _zombie(child), timeout=20)
        overlap = time.monotonic() - woken
        print(f"frozen process-pool worker woken: its child killed {overlap:.3f} s after SIGCONT")
        assert gone, f"child {child} still runs the run whose lease was taken over: {worker.text[-2000:]}"
        assert "its lease was lost while" in worker.text or wait_until(
            lambda: "its lease was lost while" in worker.text, timeout=10
        ), worker.text[-3000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.popen.pid, signal.SIGCONT)
        worker.terminate()


def _zombie(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text[text.rfind(")") + 2] == "Z"
