"""Retention of workflows (docs/workflows.md#retention): a step of an unfinished workflow is never
purged nor dropped with its period; a finished workflow goes whole (its steps, their audit rows,
its dependencies, fan-in rows and its own row) once every step is past its retention. Both passes
(the PostgreSQL one is partitioned: its period drops are tested at the end). Ages are made by
moving timestamps into the past by the database clock."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection

import zeroloss
from tests.support import backdate
from tests.support.cli import run
from zeroloss.ledger.models import Message, MessageEvent, PurgeRecord
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ledger.workflow_models import Dependency, FanIn, Workflow
from zeroloss.testing import drain

pytestmark = [pytest.mark.django_db(transaction=True)]

HOUR = 3600
DAY = 86400
#: Every finished status kept an hour; the queue "ret.slow" keeps its completed messages a day.
RETENTION = {
    "RETENTION": {"completed": "1h", "dead": "1h", "cancelled": "1h"},
    "QUEUES": {"ret.slow": {"retention": {"completed": "1d"}}},
}


@zeroloss.handler("ret.a")
def step_a(delivery: Any) -> Any:
    if delivery.payload.get("fail"):
        raise zeroloss.Fail("told to")
    return delivery.message_id


@zeroloss.handler("ret.slow")
def step_slow(delivery: Any) -> None:
    return None


@pytest.fixture
def retained(settings: Any) -> None:
    settings.ZEROLOSS = {**settings.ZEROLOSS, **RETENTION}


def diamond(wid: str, *, fail_b: bool = False, policy: str = "wait", last: str = "ret.a") -> None:
    flow = zeroloss.Workflow(wid)
    a = flow.step("ret.a", {}, name="A")
    b = flow.step("ret.a", {"fail": fail_b}, name="B", after=[a], max_attempts=1)
    c = flow.step("ret.a", {}, name="C", after=[a])
    flow.step(last, {}, name="D", after=[b, c], on_upstream_failure=policy)
    flow.send()


def age(message_ids: list[str], seconds: float) -> None:
    """Each finished message finished ``seconds`` ago (its status's own timestamp)."""
    for status, column in (("completed", "completed_at"), ("dead", "dead_at"), ("cancelled", "updated_at")):
        ids = list(
            Message.objects.filter(message_id__in=message_ids, status=status).values_list(
                "message_id", flat=True
            )
        )
        if ids:
            assert backdate(ids, column, seconds_ago=seconds) == len(ids)


def steps_of(wid: str) -> list[str]:
    return sorted(Message.objects.filter(workflow_id=wid).values_list("message_id", flat=True))


def gone_whole(wid: str) -> bool:
    """Nothing of the workflow is left: steps, audit rows, dependencies, fan-in rows, its row."""
    return not (
        Message.objects.filter(workflow_id=wid).exists()
        or MessageEvent.objects.filter(message__workflow_id=wid).exists()
        or Dependency.objects.filter(workflow_id=wid).exists()
        or Workflow.objects.filter(workflow_id=wid).exists()
    )


def kept_whole(wid: str, steps: int = 4) -> bool:
    return (
        len(steps_of(wid)) == steps
        and Workflow.objects.filter(workflow_id=wid).exists()
        and Dependency.objects.filter(workflow_id=wid).count() == 4
    )


def verify_ok() -> None:
    result = run("zeroloss_verify", "--json")
    data = json.loads(result.out)
    assert data["conservation"]["balanced"], data
    assert data["workflows"] == {"stranded": 0, "released_early": 0}
    assert not [i for i in data["issues"] if i["severity"] == "critical"], data["issues"]


def test_retention_takes_a_finished_workflow_whole_and_never_a_step_of_an_unfinished_one(
    retained: None,
) -> None:
    diamond("done")
    diamond("blocked", fail_b=True)  # B dead, D waits for a redrive: unfinished
    diamond("recent")
    zeroloss.send("ret.a", {}, message_id="plain")
    drain()
    assert Message.objects.get(message_id="blocked/D").status == "waiting"
    age([*steps_of("done"), *steps_of("blocked"), "plain"], 2 * HOUR)
    age(steps_of("recent"), 2 * HOUR)
    age(["recent/D"], 60)  # its last step finished a minute ago: within the retention
    fanins = FanIn.objects.count()

    removed = ZeroLossMessageService().apply_retention(actor="ret")

    assert removed["completed"] == 5  # done's four steps and "plain"
    assert gone_whole("done")
    assert kept_whole("blocked")  # its completed A and C are past the retention: kept all the same
    assert kept_whole("recent")
    assert not Message.objects.filter(message_id="plain").exists()
    assert FanIn.objects.count() == fanins - 3  # done's B, C and D had one group each
    assert sorted(PurgeRecord.objects.values_list("queue_name", "status", "count", "actor")) == [
        ("ret.a", "completed", 1, "ret"),
        ("ret.a", "completed", 4, "ret"),
    ]
    verify_ok()


def test_a_finished_workflow_goes_when_its_last_step_is_past_its_own_retention(retained: None) -> None:
    """Each step by its status's and queue's retention: the dead B and cancelled D an hour,
    and a step of the queue that keeps completed messages a day holds the whole workflow."""
    diamond("failed", fail_b=True, policy="cancel")
    diamond("slow", last="ret.slow")
    drain()
    assert Message.objects.get(message_id="failed/D").status == "cancelled"
    assert Message.objects.get(message_id="slow/D").status == "completed"
    age([*steps_of("failed"), *steps_of("slow")], 2 * HOUR)
    service = ZeroLossMessageService()
    removed = service.apply_retention()
    assert gone_whole("failed")
    assert (removed["completed"], removed["dead"], removed["cancelled"]) == (2, 1, 1)
    assert kept_whole("slow")
    age(["slow/D"], 2 * DAY)
    assert service.apply_retention()["completed"] == 4
    assert gone_whole("slow")
    verify_ok()


def test_a_purge_by_status_takes_a_workflow_whose_steps_all_have_that_status(retained: None) -> None:
    diamond("done")
    diamond("failed", fail_b=True, policy="cancel")
    diamond("blocked", fail_b=True)
    drain()
    age([*steps_of("done"), *steps_of("failed"), *steps_of("blocked")], 2 * HOUR)
    service = ZeroLossMessageService(instance_id="purger")
    assert service.purge_messages(status="completed", older_than=HOUR) == 4
    assert gone_whole("done")
    # Its dead and cancelled steps are no completed messages: kept whole, by this purge and by
    # the purges of the other statuses.
    assert kept_whole("failed") and kept_whole("blocked")
    assert service.purge_messages(status="dead", older_than=HOUR) == 0
    assert service.purge_messages(status="cancelled", older_than=HOUR) == 0
    assert kept_whole("failed") and kept_whole("blocked")
    # A limit stops before the next workflow, never inside one.
    diamond("more")
    diamond("again")
    drain()
    age([*steps_of("more"), *steps_of("again")], 2 * HOUR)
    assert service.purge_messages(status="completed", older_than=HOUR, limit=1) == 4
    assert [gone_whole("more"), gone_whole("again")] == [True, False]
    verify_ok()


def test_a_redrive_makes_a_finished_workflow_unfinished_again(retained: None) -> None:
    """A redriven dead step is live again: its workflow is kept whole."""
    diamond("failed", fail_b=True, policy="cancel")
    drain()
    age(steps_of("failed"), 2 * HOUR)
    ZeroLossMessageService().redrive_messages(["failed/B"], actor="op")
    assert sum(ZeroLossMessageService().apply_retention().values()) == 0
    assert kept_whole("failed")


# -- a partitioned ledger (PostgreSQL): a period holding a step is never dropped --------------------


@pytest.mark.postgres_only
def test_a_period_holding_a_step_is_kept_and_goes_once_its_workflow_went_whole() -> None:
    from tests.ledger.test_partitions import day_start, move_to_day  # deferred: PostgreSQL only
    from zeroloss.ledger import partition_drops, partitions  # deferred: PostgreSQL only

    assert partitions.is_partitioned(connection)
    partitions.create_partitions(connection, day_start(12), day_start(7), DAY)
    diamond("done")
    zeroloss.send("ret.a", {}, message_id="plain")
    drain()
    diamond("live")  # only A has run: B and C pending, D waiting
    service = ZeroLossMessageService(instance_id="purger")
    lease = service.claim_message("live/A")
    assert lease is not None and service.acknowledge("live/A", lease.token)
    move_to_day(["live/A"], 10)  # a completed step of an unfinished workflow: its day stays
    move_to_day(steps_of("done"), 9)  # a finished workflow: goes whole, then its day
    move_to_day(["plain"], 8)
    day = {d: f"zeroloss_message_p{day_start(d):%Y%m%d}" for d in (10, 9, 8)}

    def probed_kept(d: int) -> bool:
        return partition_drops._holds_kept(connection, day[d], day_start(7), None)

    # Each day holds completed messages only, past the cut-off: the probe keeps those holding a step.
    assert [probed_kept(10), probed_kept(9), probed_kept(8)] == [True, True, False]
    assert service.purge_messages(older_than=7 * DAY) == 5
    left = {p.name for p in partitions.partitions(connection)}
    assert day[10] in left and day[9] not in left and day[8] not in left
    assert len(steps_of("live")) == 4 and Message.objects.get(message_id="live/A").status == "completed"
    assert gone_whole("done")
    verify_ok()


def test_zeroloss_purge_counts_what_it_takes_and_takes_it(retained: None) -> None:
    diamond("done")
    diamond("blocked", fail_b=True)
    zeroloss.send("ret.a", {}, message_id="plain")
    drain()
    age([*steps_of("done"), *steps_of("blocked"), "plain"], 2 * HOUR)
    dry = json.loads(run("zeroloss_purge", "--older-than", "1h", "--dry-run", "--json").out)
    assert dry["matched"] == 5  # done's four steps and "plain"; not blocked's completed A and C
    result = run("zeroloss_purge", "--older-than", "1h", "--yes", "--json")
    assert result.code == 0, result.err
    assert (json.loads(result.out)["matched"], json.loads(result.out)["purged"]) == (5, 5)
    assert gone_whole("done") and kept_whole("blocked")
    verify_ok()
