"""The invariants of workflows (docs/workflows.md): ``zeroloss_verify`` reports a step stranded
(waiting, every dependency settled) or released early (left waiting while a dependency is
unsettled), and the sweep's safety net releases a stranded step. Both passes."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

import zeroloss
from tests.support.cli import run
from zeroloss.ledger import sweep as sweep_module
from zeroloss.ledger.models import Message, MessageEvent
from zeroloss.ledger.types import Completion, Verdict
from zeroloss.ledger.workflow_models import Dependency, FanIn
from zeroloss.testing import drain


@zeroloss.handler("inv.a")
def step_a(delivery: Any) -> Any:
    return delivery.message_id


@zeroloss.handler("inv.b")
def step_b(delivery: Any) -> Any:
    if delivery.payload.get("fail"):
        raise zeroloss.Fail("told to")
    return None


@pytest.fixture(autouse=True)
def _look_every_sweep() -> Any:
    sweep_module.STRANDED_CHECKED.clear()
    yield
    sweep_module.STRANDED_CHECKED.clear()


def diamond(wid: str = "d", *, fail_b: bool = False, policy: str = "wait") -> None:
    flow = zeroloss.Workflow(wid)
    a = flow.step("inv.a", {}, name="A")
    b = flow.step("inv.b", {"fail": fail_b}, name="B", after=[a], max_attempts=1)
    c = flow.step("inv.b", {}, name="C", after=[a])
    flow.step("inv.b", {}, name="D", after=[b, c], on_upstream_failure=policy)
    flow.send()


def status(mid: str) -> str:
    return Message.objects.get(message_id=mid).status


def strand(mid: str) -> None:
    """What a lost release would leave: every edge of the step settled and its groups counted
    down, the step itself still waiting."""
    pk = Message.objects.get(message_id=mid).pk
    Dependency.objects.filter(downstream=pk).update(settled_status="completed")
    FanIn.objects.filter(downstream=pk).update(remaining=0)
    Message.objects.filter(pk=pk).update(waiting_on=0)


def verify(*args: str) -> tuple[int, dict[str, Any]]:
    r = run("zeroloss_verify", "--json", *args)
    return r.code, json.loads(r.out)


def issues(data: dict[str, Any], check: str) -> list[dict[str, Any]]:
    return [i for i in data["issues"] if i["check"] == check]


def test_a_finished_workflow_and_a_blocked_one_are_clean(db: None) -> None:
    diamond("ok")
    diamond("blocked", fail_b=True)  # B dead, D waits for a redrive: blocked, not stranded
    diamond("cancelled", fail_b=True, policy="cancel")
    drain()
    assert status("ok/D") == "completed"
    assert status("blocked/D") == "waiting"
    assert status("cancelled/D") == "cancelled"
    code, data = verify()
    assert data["workflows"] == {"stranded": 0, "released_early": 0}
    assert not issues(data, "workflow_step_stranded") and not issues(data, "workflow_step_released_early")
    assert code == 0, data["issues"]
    report = zeroloss.ZeroLossMessageService().sweep()
    assert report.released_stranded == []
    assert status("blocked/D") == "waiting"


def test_a_stranded_step_is_reported_then_released_by_the_sweep(
    db: None, caplog: pytest.LogCaptureFixture
) -> None:
    diamond()
    strand("d/D")
    code, data = verify()
    assert code == 1  # a warning: the sweep repairs it
    assert data["workflows"]["stranded"] == 1
    (found,) = issues(data, "workflow_step_stranded")
    assert found["message_id"] == "d/D" and found["severity"] == "warning"

    service = zeroloss.ZeroLossMessageService(instance_id="sweeper")
    with caplog.at_level(logging.WARNING, logger="zeroloss"):
        report = service.sweep()
    assert report.released_stranded == ["d/D"]
    assert status("d/D") == "pending"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "d/D" in warnings[0], warnings
    event = MessageEvent.objects.for_message("d/D").order_by("-id").first()
    assert event is not None
    assert (event.from_status, event.to_status, event.reason) == (
        "waiting",
        "pending",
        "dependencies_completed",
    )
    assert event.actor == "sweep@sweeper" and "sweep" in event.detail
    # Released once: nothing left for the next look, and the ledger is clean again (the step
    # left waiting with every edge settled: not early).
    sweep_module.STRANDED_CHECKED.clear()
    assert service.sweep().released_stranded == []
    code, data = verify()
    assert data["workflows"] == {"stranded": 0, "released_early": 0}
    assert code == 0, data["issues"]


def test_the_sweep_looks_for_stranded_steps_at_most_every_interval(db: None) -> None:
    diamond()
    service = zeroloss.ZeroLossMessageService()
    assert service.sweep().released_stranded == []  # looked: nothing stranded
    strand("d/D")
    assert service.sweep().released_stranded == []  # within STRANDED_EVERY: not looked again
    assert status("d/D") == "waiting"
    sweep_module.STRANDED_CHECKED.clear()
    assert service.sweep().released_stranded == ["d/D"]


def test_the_safety_net_releases_no_step_with_an_unsettled_dependency(db: None) -> None:
    """``release_stranded`` reads the condition again in its statement: a step that is not (or
    no longer) stranded stays waiting, whatever ids it is given."""
    diamond()
    d = Message.objects.get(message_id="d/D")
    service = zeroloss.ZeroLossMessageService()
    assert service.workflows.release_stranded([d.pk]) == []
    assert status("d/D") == "waiting"
    # One of its two edges settled: still not stranded.
    Dependency.objects.filter(downstream=d.pk, upstream="d/B").update(settled_status="completed")
    assert service.workflows.release_stranded([d.pk]) == []
    assert status("d/D") == "waiting"


@pytest.mark.parametrize("moved_to", ["pending", "processing", "completed", "dead"])
def test_a_step_released_early_is_reported_critical(db: None, moved_to: str) -> None:
    diamond()
    service = zeroloss.ZeroLossMessageService()
    (a,) = service.claim("inv.a", limit=1)
    service.record_outcomes([Completion(a, Verdict.ACKNOWLEDGE)])
    # D out of waiting although B and C have not run (as a release without its fence would).
    Message.objects.filter(message_id="d/D").update(status=moved_to)
    code, data = verify()
    assert code == 2
    assert data["workflows"]["released_early"] == 1
    (found,) = issues(data, "workflow_step_released_early")
    assert found["message_id"] == "d/D" and found["severity"] == "critical"
    assert moved_to in found["detail"] and "d/B" in found["detail"]
    assert data["workflows"]["stranded"] == 0


def test_a_cancelled_waiting_step_is_not_released_early(db: None) -> None:
    diamond()
    zeroloss.cancel("d/D")
    _, data = verify()
    assert data["workflows"] == {"stranded": 0, "released_early": 0}


def test_the_checks_follow_the_queue(db: None) -> None:
    diamond()
    strand("d/D")
    _, data = verify("--queue", "inv.a")
    assert data["workflows"]["stranded"] == 0
    _, data = verify("--queue", "inv.b")
    assert data["workflows"]["stranded"] == 1


def test_every_issue_is_counted_beyond_those_listed(db: None) -> None:
    for n in range(3):
        diamond(f"w{n}")
        strand(f"w{n}/D")
    _, data = verify("--max-issues", "1")
    assert data["issue_counts"]["workflow_step_stranded"] == 3
    assert len(issues(data, "workflow_step_stranded")) == 1


def test_the_celery_sweep_task_counts_released_steps(db: None) -> None:
    from zeroloss.integrations.celery.tasks import sweep  # deferred: Celery only for this test

    diamond()
    strand("d/D")
    totals = sweep()
    assert totals["released_stranded"] == 1
    assert status("d/D") == "pending"
