"""Ordered delivery and deduplication with real processes: producers, workers, SIGKILLs."""

from __future__ import annotations

import collections
import random
import time
from pathlib import Path

import pytest

from project.demo.models import OrderedRun
from tests.support.processes import db_worker
from zeroloss.ledger.models import Message, Status
from zeroloss.ledger.service import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

KEYS = 20
PER_KEY = 200
FAILING_KEYS = {3, 11}  # their 50th message always fails: dead after 2 attempts, then the key moves on


@pytest.mark.once
@pytest.mark.postgres_only  # 4,000 messages through 8 threads: SQLite's one writer would only queue them
def test_each_key_in_order_one_at_a_time_through_kills_and_failing_heads(children, tmp_path: Path):
    rng = random.Random(16)
    # 20 keys x 200 messages, split among 4 producers, each sending its share of every key in order.
    plan: list[list[tuple[str, str, dict[str, object]]]] = [[] for _ in range(4)]
    for k in range(KEYS):
        for n in range(PER_KEY):
            payload: dict[str, object] = {"n": n}
            if k in FAILING_KEYS and n == 50:
                payload["fail"] = True
            plan[(k + n) % 4].append((f"k{k:02d}-{n:03d}", f"key-{k}", payload))
    for share in plan:
        share.sort(key=lambda m: (int(m[0][5:]), m[0]))  # interleave the keys within a producer
    start = tmp_path / "go"
    env = {
        "ZEROLOSS_ACK_TIMEOUT": "2",
        "ZEROLOSS_SWEEP_INTERVAL": "0.5",
        "ZEROLOSS_RETRY_BACKOFF_BASE": "0.1",
    }
    started = iter(range(100))

    def worker():  # each its own application_name, so a kill waits for exactly its sessions
        return db_worker(
            "--queue", "demo.ordered", "--concurrency", "2", PGAPPNAME=f"zlw-{next(started)}", **env
        )

    workers = [worker() for _ in range(4)]
    producers = [
        children.spawn("send_ordered", {"queue": "demo.ordered", "messages": share, "start_file": str(start)})
        for share in plan
    ]
    try:
        children.start_together(start, producers)
        kills = 0
        deadline = time.monotonic() + 240
        while kills < 3 and time.monotonic() < deadline:
            time.sleep(rng.uniform(1.0, 3.0))  # the fault schedule: kills at random moments
            victim = workers.pop(rng.randrange(len(workers)))
            victim.sigkill_group()
            kills += 1
            workers.append(worker())
        sends = {
            mid: (called, returned)
            for p in producers
            for mid, called, returned in children.finish(p, 240)[0]["sent"]
        }
        total = KEYS * PER_KEY
        assert wait_until(
            lambda: Message.objects.filter(status__in=[Status.COMPLETED, Status.DEAD]).count() == total,
            timeout=300,
            interval=0.5,
        ), collections.Counter(Message.objects.values_list("status", flat=True))
    finally:
        for w in workers:
            w.terminate()

    # Every message completed, but the two poison heads, which are dead.
    dead = set(Message.objects.filter(status=Status.DEAD).values_list("message_id", flat=True))
    assert dead == {f"k{k:02d}-050" for k in FAILING_KEYS}
    # The messages of each key, and the handlers' own log of every run.
    order = collections.defaultdict(list)
    for mid, key in Message.objects.order_by("id").values_list("message_id", "ordering_key"):
        order[key].append(mid)
    runs = collections.defaultdict(list)
    for run in OrderedRun.objects.order_by("started", "id"):
        runs[run.ordering_key].append(run)
    assert set(sends) == {mid for persisted in order.values() for mid in persisted}
    for key, persisted in order.items():
        # The order of a key is the order its sends were stored: a send that returned before
        # another was called runs first. Two sends that overlapped in time (other producers)
        # have no order between them: the first to commit is first.
        first_run: dict[str, int] = {}
        for i, r in enumerate(runs[key]):
            first_run.setdefault(r.message_id, i)
        by_call = sorted(persisted, key=lambda mid: sends[mid][0])
        for i, later in enumerate(by_call):
            for earlier in by_call[:i]:
                if sends[earlier][1] < sends[later][0]:
                    assert first_run[earlier] < first_run[later], (
                        f"{key}: {later} ran before {earlier}, whose send had returned before it was called"
                    )
        for before, after in zip(runs[key], runs[key][1:], strict=False):
            if before.finished is not None and after.message_id != before.message_id:
                assert after.started >= before.finished, (
                    f"{key}: {after.message_id} ran while {before.message_id} was unfinished"
                )
        finished = {r.message_id for r in runs[key] if r.finished is not None}
        assert finished == set(persisted) - dead, f"{key}: not every message finished once"


def test_concurrent_senders_of_one_dedup_key_create_exactly_one_message(children, tmp_path: Path):
    start = tmp_path / "go"
    senders = [
        children.spawn(
            "dedup_send",
            {"queue": "demo.record", "me": f"sender-{n}", "key": "order-1", "start_file": str(start)},
        )
        for n in range(4)
    ]
    children.start_together(start, senders)
    got = {children.finish(p)[0]["got"] for p in senders}
    assert len(got) == 1
    assert Message.objects.count() == 1 and Message.objects.get().message_id in got
