"""Which commits wait for the disk (PostgreSQL): claims and renewals in transactions of their own
do not (``synchronous_commit`` off for that transaction only); sends, acknowledgements, failures,
claims inside a caller's transaction and everything after them do.

The storage fault suite shows what it is for: tests/test_faults.py, a stall of every fsync.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
from django.db import connection, transaction

from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ledger.types import Completion, Verdict
from zeroloss.runtime.worker.loop import ClaimLoop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres_only]


@pytest.fixture
def settings_seen() -> Iterator[list[tuple[str, str]]]:
    """Each statement zeroloss runs, with ``synchronous_commit`` as its transaction has it just
    before it (read on the same connection, in the same transaction)."""
    seen: list[tuple[str, str]] = []

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        if "synchronous_commit" not in sql:
            setting = connection.connection.execute("SHOW synchronous_commit").fetchone()[0]
            seen.append((" ".join(str(sql).split())[:60], setting))
        return execute(sql, params, many, context)

    connection.ensure_connection()
    with connection.execute_wrapper(wrapper):
        yield seen


def _statements(seen: list[tuple[str, str]], run: Callable[[], Any]) -> list[str]:
    seen.clear()
    run()
    assert seen, "no statement seen"
    return [setting for _, setting in seen]


def _claimed(seen: list[tuple[str, str]], run: Callable[[], Any]) -> str:
    """The setting the claim's or renewal's own statement ran with (the one that moves the row)."""
    seen.clear()
    run()
    moving = [s for sql, s in seen if sql.startswith("WITH") or "UPDATE" in sql]
    assert moving, f"no claim or renewal statement among {seen}"
    return moving[-1]


def test_claims_and_renewals_commit_unflushed_everything_else_waits_for_the_disk(
    settings_seen: list[tuple[str, str]],
):
    service = ZeroLossMessageService(instance_id="unflushed-a")
    assert set(_statements(settings_seen, lambda: service.persist_message("u-1", "unflushed.q", {}))) == {
        "on"
    }
    service.persist_message("u-2", "unflushed.q", {})
    service.persist_message("u-3", "unflushed.q", {})

    leases: list[Any] = []
    assert _claimed(settings_seen, lambda: leases.extend(service.claim("unflushed.q", limit=2))) == "off"
    assert len(leases) == 2
    # SET LOCAL: the next transaction on the connection is as before.
    assert connection.connection.execute("SHOW synchronous_commit").fetchone()[0] == "on"

    assert _claimed(settings_seen, lambda: service.renew_leases(leases)) == "off"
    assert (
        _claimed(settings_seen, lambda: service.renew_lease(leases[0].message_id, leases[0].token)) == "off"
    )

    assert set(_statements(settings_seen, lambda: service.acknowledge("u-1", leases[0].token))) == {"on"}
    assert set(
        _statements(
            settings_seen, lambda: service.record_outcomes([Completion(leases[1], Verdict.FAIL, "boom")])
        )
    ) == {"on"}

    # Inside the caller's transaction the commit is the caller's: it waits, claims included.
    def claim_in_callers_transaction() -> None:
        with transaction.atomic():
            assert service.claim("unflushed.q", limit=1)
            service.renew_leases([])

    assert set(_statements(settings_seen, claim_in_callers_transaction)) == {"on"}


def test_a_limited_claim_commits_unflushed(settings_seen: list[tuple[str, str]]):
    service = ZeroLossMessageService(instance_id="unflushed-b")
    service.limit_queue("unflushed.limited", concurrency=2, actor="test")
    service.persist_message("l-1", "unflushed.limited", {})
    leases: list[Any] = []
    assert (
        _claimed(settings_seen, lambda: leases.extend(service.claim("unflushed.limited", limit=5))) == "off"
    )
    assert [x.message_id for x in leases] == ["l-1"]


def test_the_workers_outcomes_wait_for_the_disk_and_its_next_claim_does_not(
    settings_seen: list[tuple[str, str]],
):
    """The worker records what its handlers finished, then claims: two commits on PostgreSQL,
    the first waiting for the disk, the second not (one commit for both would make the claim
    wait, or the outcomes not)."""
    service = ZeroLossMessageService(instance_id="unflushed-c")
    for i in range(3):
        service.persist_message(f"w-{i}", "unflushed.worker", {})
    first = service.claim("unflushed.worker", limit=1)
    settings_seen.clear()
    report, leases = ClaimLoop._record_and_claim(
        cast(ClaimLoop, _LoopOf(service)), [Completion(first[0], Verdict.ACKNOWLEDGE)], "unflushed.worker", 2
    )
    assert report is not None and report.acknowledged == ["w-0"]
    assert len(leases) == 2
    acked = [s for sql, s in settings_seen if "acknowledged" in sql or "'done'" in sql]
    moving = [s for sql, s in settings_seen if sql.startswith("WITH") or "UPDATE" in sql]
    assert moving[0] == "on", settings_seen  # the acknowledgement
    assert moving[-1] == "off", settings_seen  # the claim
    assert all(s == "on" for s in acked)


class _LoopOf:
    """What ``ClaimLoop._record_and_claim`` uses of its loop: the service."""

    def __init__(self, service: ZeroLossMessageService) -> None:
        self.service = service
