"""Queue limits under racing claimers on real PostgreSQL (docs/control.md, "How each guarantee
holds"): the slot path and the exact path together never let more than the limit be processing.

Sixteen threads, each with its own connection, claim a queue whose concurrency limit is large
enough for slot claims (a share of 1 per slot) but far smaller than what they ask for together,
hold what they claimed a moment, then acknowledge it: the limit is reached and released over
and over, and claims switch between the two paths at its edge. The same for a rate kept in slot
shares: sixteen claimers never start more than its burst (an hourly rate refills under a token).
"""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

from tests.support.waiting import hold_for
from zeroloss.core.rates import parse_rate
from zeroloss.ledger import control, control_claims, limits
from zeroloss.ledger.models import Message, QueueControl, RateBucket
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ledger.types import Completion, Verdict

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]

LIMIT = 2 * control.SLOTS  # a slot claim's share: 1
CLAIMERS = 16  # more than the slots: some claims find none and take the exact path
ROUNDS = 25


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one instant (an end before a start at the same instant)."""
    edges = sorted(
        [(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans], key=lambda e: (e[0], e[1])
    )
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@pytest.fixture(autouse=True)
def _every_claim_tries_a_slot(monkeypatch):
    # A slot claim that finds the queue near its limit sends this process's claims to the exact
    # path for REFRESH seconds; with 0 every claim tries its slot first, at the edge too.
    monkeypatch.setattr(control_claims, "REFRESH", 0.0)
    control._CONTROLLED.clear()
    control._EXACT.clear()
    control._SLOTTED.clear()
    yield
    control._CONTROLLED.clear()
    control._EXACT.clear()
    control._SLOTTED.clear()


@pytest.fixture
def in_slot(monkeypatch) -> list[int]:
    """How many messages each slot claim took: the real slot claim, counted."""
    taken: list[int] = []
    claim_in_slot = control.Control._claim_in_slot

    def counted(self, queue_name, limit, claim):
        leases = claim_in_slot(self, queue_name, limit, claim)
        if leases:
            taken.append(len(leases))
        return leases

    monkeypatch.setattr(control.Control, "_claim_in_slot", counted)
    return taken


def test_slot_and_exact_claims_racing_at_the_limit_never_exceed_it(in_slot):
    service = ZeroLossMessageService()
    service.persist_messages([(f"m{i}", "q", {}) for i in range(CLAIMERS * ROUNDS * 3)])
    service.limit_queue("q", concurrency=LIMIT)
    assert limits.slot_share(LIMIT) == 1

    spans: list[tuple[float, float]] = []
    seen: list[int] = []
    errors: list[BaseException] = []
    go = threading.Barrier(CLAIMERS)

    processing = Message.objects.filter(queue_name="q", status="processing")

    def claimer(n: int) -> None:
        try:
            mine = ZeroLossMessageService(instance_id=f"c{n}")
            go.wait()
            for _ in range(ROUNDS):
                # Two claims before either outcome: each claimer holds up to two slot shares.
                leases = mine.claim("q", limit=3) + mine.claim("q", limit=3)
                if not leases:
                    continue
                # Between the claim's commit and the outcome's: inside the messages' processing.
                started = time.monotonic()
                # sampled through the processing's 30 ms, not only at its start
                hold_for(0.03, lambda: seen.append(processing.count()), interval=0.01)
                ended = time.monotonic()
                spans.extend((started, ended) for _ in leases)
                mine.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE) for lease in leases])
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(CLAIMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert max(seen) <= LIMIT, max(seen)
    assert max_overlap(spans) <= LIMIT, max_overlap(spans)
    # The race was real: the limit was reached, and slot claims took part in it.
    assert max(max(seen), max_overlap(spans)) >= LIMIT - 4, (max(seen), max_overlap(spans))
    assert sum(in_slot) > 0
    assert Message.objects.filter(queue_name="q", status="processing").count() == 0


RATE = "160/h"  # a burst of 16: a slot share of 1, two tokens in each slot's share of the bucket
BURST = 16


def age_shares(queue: str, seconds: float) -> None:
    """Move every slot share's last refill ``seconds`` into the past (the database clock)."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            f"UPDATE {RateBucket._meta.db_table} SET refilled_at = refilled_at - %s * interval '1 second' "
            "WHERE queue_name = %s",
            [seconds, queue],
        )


def test_slot_and_exact_claims_racing_for_a_rate_never_take_more_than_its_bucket(in_slot):
    """A rate large enough for slot claims keeps its bucket in one share per slot: slot claims
    spend their own slot's share, exact claims all of them, and together they never start more
    than the burst plus what the rate refilled meanwhile (an hourly rate: under a token here)."""
    service = ZeroLossMessageService()
    service.persist_messages([(f"m{i}", "q", {}) for i in range(200)])
    service.limit_queue("q", rate=RATE)
    assert parse_rate(RATE).burst == BURST and limits.slot_share(BURST) == 1

    claimed: list[int] = []
    errors: list[BaseException] = []
    go = threading.Barrier(CLAIMERS)

    def claimer(n: int) -> None:
        try:
            mine = ZeroLossMessageService(instance_id=f"c{n}")
            go.wait()
            for _ in range(6):
                leases = mine.claim("q", limit=3)
                claimed.append(len(leases))
                mine.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE) for lease in leases])
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    started = time.monotonic()
    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(CLAIMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    elapsed = time.monotonic() - started
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    refilled = parse_rate(RATE).per_second * elapsed
    assert BURST <= sum(claimed) <= BURST + refilled, (sum(claimed), elapsed)
    assert sum(in_slot) > 0  # slot claims took part, beside the exact ones
    # The control row's bucket is not what was spent: the slots' shares were.
    assert RateBucket.objects.filter(queue_name="q").count() == control.SLOTS

    age_shares("q", 3600)  # an hour: every share full again, never fuller
    again = 0
    while leases := service.claim("q", limit=50):
        again += len(leases)
    assert again == BURST

    service.limit_queue("q", rate="320/h")  # a changed limit starts full shares
    assert not RateBucket.objects.filter(queue_name="q").exists()


def test_a_rate_far_from_its_limit_is_spent_without_writing_the_control_row():
    """Slot claims of a large rate write their own slot's share, never the row every claim of
    the queue would otherwise wait for."""
    service = ZeroLossMessageService()
    service.persist_messages([(f"m{i}", "q", {}) for i in range(40)])
    service.limit_queue("q", rate="3600/h", concurrency=1000)  # shares of 45 tokens, refilled slowly

    def version() -> str:
        with connections["default"].cursor() as cursor:
            cursor.execute(
                f"SELECT xmin::text FROM {QueueControl._meta.db_table} WHERE queue_name = %s", ["q"]
            )
            return cursor.fetchone()[0]

    before = version()
    taken = sum(len(service.claim("q", limit=5)) for _ in range(8))
    assert taken == 40
    assert version() == before
    spent = RateBucket.objects.filter(queue_name="q")
    assert 1 <= spent.count() <= control.SLOTS
    # What the used shares lack is what was claimed, less the little an hourly rate refilled.
    lacking = parse_rate("3600/h").burst / control.SLOTS * spent.count() - sum(b.tokens for b in spent)
    assert 40 - 1 <= lacking <= 40 + 1e-6, lacking
