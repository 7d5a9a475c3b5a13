"""A claim starts after the claimer's previous claim (issue 24): while the xmin horizon is held,
the claim index keeps every version earlier claims moved out of it, and a claim from the head
of the queue visits them all. Priorities stay exact; what committed behind is claimed from the
head within ``CLAIM_FROM_HEAD_EVERY``."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection

from tests.support import expire_leases
from zeroloss.ledger import leases
from zeroloss.ledger.service import ZeroLossMessageService

pytestmark = pytest.mark.django_db(transaction=True)


def _url() -> str:
    s = connection.settings_dict
    return f"postgres://{s.get('USER') or 'postgres'}@{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"


@pytest.fixture
def held_xmin() -> Iterator[None]:
    """``BEGIN; SELECT txid_current();`` on another session, idle until the test ends."""
    holder = psycopg.connect(_url(), autocommit=False)
    try:
        holder.execute("SELECT txid_current()")
        yield
    finally:
        holder.rollback()
        holder.close()


def _claim_buffers(service: ZeroLossMessageService, params: dict[str, Any]) -> int:
    """Shared buffers CLAIM's index ranges read with these parameters (EXPLAIN ANALYZE, rolled back)."""
    sql = service.engine.sql["CLAIM"]
    with psycopg.connect(_url(), autocommit=True) as conn, conn.transaction(force_rollback=True):
        row = conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}",
            {"ack_timeout": 5.0, "claimed_by": "test", "detail": "", **params},
        ).fetchone()
    assert row is not None
    plan = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]["Plan"]
    # The locking subquery (the claim index's ranges), not the update of the rows it chose.
    (scan,) = [p for p in plan["Plans"] if p.get("Parent Relationship") == "InitPlan"]
    return int(scan.get("Shared Hit Blocks", 0)) + int(scan.get("Shared Read Blocks", 0))


@pytest.mark.postgres_only
def test_a_claim_after_the_previous_one_does_not_revisit_what_earlier_claims_left(held_xmin: None) -> None:
    service = ZeroLossMessageService(instance_id="w")
    service.persist_messages([(f"m{i}", "q", {}) for i in range(3000)])
    with connection.cursor() as cur:  # sent a minute ago: older than the claim's rewind
        cur.execute(
            "UPDATE zeroloss_message SET available_at = %s",
            [service.database_now() - dt.timedelta(minutes=1)],
        )
    while claimed := service.claim("q", limit=100):  # 3,000 versions left in the claim index
        assert all(service.acknowledge(x.message_id, x.token) for x in claimed)
    service.persist_messages([(f"n{i}", "q", {}) for i in range(20)])
    assert [x.message_id for x in service.claim("q", limit=10)] == [f"n{i}" for i in range(10)]
    leases._HEAD_CLAIMED[("default", "q")] = leases._BEHIND_CLAIMED[("default", "q")] = time.monotonic()
    after = _claim_buffers(service, service.leases._claim_range("q", 10))
    from_head = _claim_buffers(
        service, {"queue": "q", "priority": leases._FROM_HEAD, "since": None, "limit": 10}
    )
    # From the head it walks the 3,010 versions the claims left (their heap and index pages);
    # after the previous claim, the new messages' pages only. (How many pages that is depends
    # on what vacuum and index cleanup left behind: the comparison, not a ratio, is the point.)
    assert from_head > after, (from_head, after)
    assert [x.message_id for x in service.claim("q", limit=10)] == [f"n{i}" for i in range(10, 20)]


def test_a_higher_priority_is_claimed_first_after_a_previous_claim() -> None:
    service = ZeroLossMessageService(instance_id="w")
    service.persist_messages([(f"a{i}", "q", {}) for i in range(4)])
    assert [x.message_id for x in service.claim("q", limit=2)] == ["a0", "a1"]
    service.persist_message("urgent", "q", {}, priority=50)
    service.persist_message("low", "q", {}, priority=-10)
    service.persist_message("a4", "q", {})
    assert [x.message_id for x in service.claim("q", limit=10)] == ["urgent", "a2", "a3", "a4", "low"]


def test_what_committed_behind_the_previous_claim_is_claimed_from_further_back() -> None:
    service = ZeroLossMessageService(instance_id="w")
    service.persist_messages([(f"a{i}", "q", {}) for i in range(3)])
    assert len(service.claim("q", limit=3)) == 3
    # Messages whose sending transactions committed long after their statements: available
    # since well before this claimer's previous claim (and its rewind).
    service.persist_messages([("late", "q", {}), ("later", "q", {})])
    now = service.database_now()
    with connection.cursor() as cur:
        for message_id, ago in (("late", dt.timedelta(seconds=30)), ("later", dt.timedelta(minutes=10))):
            cur.execute(
                "UPDATE zeroloss_message SET available_at = %s WHERE message_id = %s", [now - ago, message_id]
            )
    if connection.vendor == "sqlite":  # no dead versions in its indexes: every claim from the head
        assert [x.message_id for x in service.claim("q", limit=5)] == ["late", "later"]
        return
    key = ("default", "q")
    leases._HEAD_CLAIMED[key] = leases._BEHIND_CLAIMED[key] = time.monotonic()  # neither due
    assert service.claim("q", limit=5) == []  # behind where this claimer's claims got to
    # Due (moved there by the remembered times, not by waiting): the claim from CLAIM_BEHIND back...
    leases._BEHIND_CLAIMED[key] -= leases.CLAIM_BEHIND_EVERY + 1
    assert [x.message_id for x in service.claim("q", limit=5)] == ["late"]
    assert service.claim("q", limit=5) == []
    # ... and the claim from the head.
    leases._HEAD_CLAIMED[key] -= leases.CLAIM_FROM_HEAD_EVERY + 1
    assert [x.message_id for x in service.claim("q", limit=5)] == ["later"]
    assert leases._HEAD_CLAIMED[key] > time.monotonic() - 60  # remembered as made


def _sweep_buffers(service: ZeroLossMessageService, since: Any) -> int:
    """Shared buffers SWEEP reads from this bound (EXPLAIN ANALYZE, rolled back)."""
    sql = service.engine.sql["SWEEP"]
    with psycopg.connect(_url(), autocommit=True) as conn, conn.transaction(force_rollback=True):
        row = conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", {"since": since, "limit": 1000}
        ).fetchone()
    assert row is not None
    plan = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]["Plan"]
    # The whole statement: its choosing subquery and the update's own look-up of the chosen rows.
    nodes = [plan, *(p for p in plan["Plans"] if p.get("Parent Relationship") == "InitPlan")]
    return sum(int(p.get("Shared Hit Blocks", 0)) + int(p.get("Shared Read Blocks", 0)) for p in nodes)


@pytest.mark.postgres_only
def test_a_sweep_after_a_complete_one_does_not_revisit_what_earlier_sweeps_left(held_xmin: None) -> None:
    from zeroloss.ledger import sweep

    service = ZeroLossMessageService(instance_id="w", ACK_TIMEOUT=300)
    service.persist_messages([(f"m{i}", "q", {}) for i in range(3000)])
    assert len(service.claim("q", limit=3000)) == 3000
    expire_leases(seconds_ago=60)
    # The first sweep (from the head) requeues them: 3,000 versions of expired leases stay in
    # the lease index while the xmin is held.
    assert service.sweep().total == 3000
    swept_from, _ = service.recovery._sweep_state()
    assert swept_from is not None
    window = _sweep_buffers(service, swept_from - sweep.SWEEP_REWIND)
    from_head = _sweep_buffers(service, sweep._LONG_AGO)
    assert from_head > 4 * max(window, 1), (from_head, window, plan_text(service, sweep._LONG_AGO))


@pytest.mark.postgres_only
def test_a_lease_that_expired_before_the_sweeps_window_is_swept_from_the_head() -> None:
    from zeroloss.ledger import sweep

    service = ZeroLossMessageService(instance_id="w")
    service.persist_messages([("old", "q", {}), ("new", "q", {})])
    assert len(service.claim("q", limit=2)) == 2
    assert service.sweep().total == 0  # complete, from the head
    # Expired long before the window: locked by a transaction the sweeps skipped, say.
    expire_leases(["old"], seconds_ago=3600)
    expire_leases(["new"], seconds_ago=1)
    assert service.sweep().requeued == ["new"]
    swept_from, head_at = service.recovery._sweep_state()
    service.recovery.__dict__["_swept"] = (swept_from, head_at - sweep.SWEEP_FROM_HEAD_EVERY - 1)
    assert service.sweep().requeued == ["old"]


def plan_text(service: ZeroLossMessageService, since: Any) -> str:
    sql = service.engine.sql["SWEEP"]
    with psycopg.connect(_url(), autocommit=True) as conn, conn.transaction(force_rollback=True):
        rows = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", {"since": since, "limit": 1000}).fetchall()
    return "\n".join(r[0] for r in rows)
