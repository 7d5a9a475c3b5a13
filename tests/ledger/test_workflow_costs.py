"""What a workflow costs in statements (docs/workflows.md#costs), counted on PostgreSQL: the send,
and each outcome of a step by what it settles. Savepoints are not counted (a caller's own)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import zeroloss
from zeroloss.ledger.types import Completion, Verdict

pytestmark = [pytest.mark.postgres_only]


@zeroloss.handler("cost.a")
def step(delivery: Any) -> None:
    return None


def statements(q: CaptureQueriesContext) -> list[str]:
    return [
        s["sql"].split()[0] + " " + s["sql"].split()[1]
        for s in q.captured_queries
        if "SAVEPOINT" not in s["sql"]
    ]


def test_the_statements_of_a_send_and_of_each_outcome_of_a_step(db: None) -> None:
    service = zeroloss.ZeroLossMessageService()
    zeroloss.send("cost.a", {}, message_id="plain")
    with CaptureQueriesContext(connection) as q:
        flow = zeroloss.Workflow("c")
        a = flow.step("cost.a", {}, name="A")
        b = flow.step("cost.a", {}, name="B")
        flow.step("cost.a", {}, name="D", after=[a, b])
        flow.send()
    # the workflow's row, the steps' keys, the steps (with their audit rows), the dependencies,
    # the fan-in groups, the wake-up: whatever the number of steps
    assert len(statements(q)) == 6, statements(q)

    leases = {m: service.claim_message(m) for m in ("plain", "c/A", "c/B")}

    def outcome(mid: str) -> int:
        lease = leases[mid]
        assert lease is not None
        with CaptureQueriesContext(connection) as q:
            service.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE)])
        return len(statements(q))

    assert outcome("plain") == 1  # a message that is no step: its outcome's statement alone
    assert outcome("c/A") == 3  # + its edge settled, its fan-in group decremented
    # the last: + the step decremented, released (its audit row in the same statement), woken
    assert outcome("c/B") == 6
    leases["c/D"] = service.claim_message("c/D")
    assert outcome("c/D") == 2  # a step nothing waits for: + the settle, which finds no edge
