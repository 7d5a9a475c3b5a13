"""A workflow that an operator has to act on, for the admin's and the commands' tests: A, then B
and C, then D (after B and C), then E (after D). B fails until :data:`HEALED` names it: drained,
B is dead and holds D and E waiting (on_upstream_failure="wait"), A and C completed."""

from __future__ import annotations

from typing import Any

import zeroloss
from zeroloss.ledger.models import Message
from zeroloss.testing import drain

OK, FLAKY = "wfops.ok", "wfops.flaky"
#: Message ids of the flaky steps that succeed now (a fix deployed, as an operator would).
HEALED: set[str] = set()


@zeroloss.handler(OK)
def ok(delivery: Any) -> Any:
    return {"step": delivery.message_id}


@zeroloss.handler(FLAKY)
def flaky(delivery: Any) -> Any:
    if delivery.message_id not in HEALED:
        raise zeroloss.Fail("the warehouse said no")
    return "picked"


def blocked_workflow(wid: str = "ops") -> dict[str, str]:
    """Send and drain the workflow; returns each step's status by name."""
    HEALED.clear()
    flow = zeroloss.Workflow(wid)
    a = flow.step(OK, {}, name="A")
    b = flow.step(FLAKY, {}, name="B", after=[a], max_attempts=1)
    c = flow.step(OK, {}, name="C", after=[a])
    d = flow.step(OK, {}, name="D", after=[b, c])
    flow.step(OK, {}, name="E", after=[d])
    flow.send()
    drain(OK, FLAKY)
    return statuses(wid)


def statuses(wid: str = "ops") -> dict[str, str]:
    return dict(Message.objects.filter(workflow_id=wid).values_list("step_name", "status"))
