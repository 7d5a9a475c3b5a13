"""``zeroloss_status --workflow`` and ``zeroloss_cancel --workflow``, and a waiting step counted
wherever statuses are counted (``zeroloss_status``, the metrics). Both passes."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import command_line, run
from tests.support.factories import clear_cache, ledger_state
from tests.support.workflows import HEALED, blocked_workflow, statuses
from zeroloss.ledger.models import MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ops.metrics import families
from zeroloss.ops.snapshot import compute_snapshot
from zeroloss.testing import drain

pytestmark = pytest.mark.django_db

BLOCKED = {"A": "completed", "B": "dead", "C": "completed", "D": "waiting", "E": "waiting"}


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def test_status_of_a_workflow_shows_its_steps_by_level_and_what_blocks_them() -> None:
    assert blocked_workflow() == BLOCKED
    r = run("zeroloss_status", "--workflow", "ops")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[0] == "workflow ops: BLOCKED, 3 of 5 steps finished"
    assert lines[1].split() == [
        "level",
        "step",
        "queue",
        "status",
        "attempts",
        "waits",
        "for",
        "result",
        "/",
        "error",
    ]
    rows = [line.split()[:6] for line in lines[3:8]]
    assert rows == [
        ["0", "A", "wfops.ok", "completed", "1/5", "-"],
        ["1", "B", "wfops.flaky", "dead", "1/1", "-"],
        ["1", "C", "wfops.ok", "completed", "1/5", "-"],
        ["2", "D", "wfops.ok", "waiting", "0/5", "B"],
        ["3", "E", "wfops.ok", "waiting", "0/5", "D"],
    ], r.out
    assert "the warehouse said no" in lines[4]
    assert lines[8] == "BLOCKED by dead step B (ops/B): zeroloss.Fail: the warehouse said no; it holds D, E"


def test_status_of_a_workflow_as_json() -> None:
    blocked_workflow()
    data = json.loads(run("zeroloss_status", "--workflow", "ops", "--json").out)
    assert set(data) == {
        "workflow_id",
        "created_at",
        "state",
        "steps_total",
        "steps_finished",
        "counts",
        "blocked",
        "steps",
    }
    assert (data["state"], data["steps_total"], data["steps_finished"]) == ("blocked", 5, 3)
    assert data["counts"] == dict.fromkeys(Status.values, 0) | {"completed": 2, "dead": 1, "waiting": 2}
    assert data["blocked"] == [
        {
            "name": "B",
            "message_id": "ops/B",
            "last_error": data["steps"][1]["last_error"],
            "holds": ["D", "E"],
        }
    ]
    assert "the warehouse said no" in data["blocked"][0]["last_error"]
    by_name = {s["name"]: s for s in data["steps"]}
    assert set(by_name["D"]) == {
        "name",
        "message_id",
        "queue",
        "status",
        "level",
        "attempts",
        "max_attempts",
        "result",
        "last_error",
        "on_upstream_failure",
        "after",
        "waits_for",
        "blocked_by",
    }
    assert (by_name["D"]["after"], by_name["D"]["waits_for"], by_name["D"]["blocked_by"]) == (
        ["B", "C"],
        ["B"],
        ["B"],
    )
    assert (by_name["E"]["waits_for"], by_name["E"]["blocked_by"], by_name["E"]["level"]) == (["D"], ["B"], 3)
    assert by_name["C"]["result"] == {"step": "ops/C"}
    # Redriven and completed: the workflow finishes, nothing blocks it.
    HEALED.add("ops/B")
    ZeroLossMessageService().redrive_messages(["ops/B"], actor="op")
    drain()
    done = json.loads(run("zeroloss_status", "--workflow", "ops", "--json").out)
    assert (done["state"], done["blocked"], done["steps_finished"]) == ("finished", [], 5)


def test_status_of_an_unknown_workflow_is_a_usage_error() -> None:
    blocked_workflow()
    for args, match in (
        (["--workflow", "nope"], "No workflow with id 'nope'"),
        (["--workflow", "x" * 300], "workflow id is 300 characters"),
        (["--workflow", "ops", "--queue", "wfops.ok"], "--workflow shows one workflow"),
    ):
        r = run("zeroloss_status", *args)
        assert r.code == 2, (args, r)
        assert match in r.err, r.err
    cli = command_line("zeroloss_status", "--workflow", "nope")
    assert cli.code == 2 and "error: No workflow with id 'nope'" in cli.err and cli.out == ""


def test_a_waiting_step_is_counted_by_zeroloss_status_and_the_metrics() -> None:
    blocked_workflow()
    data = json.loads(run("zeroloss_status", "--json", "--no-cache").out)
    assert data["totals"]["waiting"] == 2
    ok = next(q for q in data["queues"] if q["name"] == "wfops.ok")
    assert ok["counts"]["waiting"] == 2 and ok["counts"]["completed"] == 2
    table = run("zeroloss_status", "--queue", "wfops.ok", "--no-cache").out.splitlines()
    header = table[0].split()
    row = table[2].split()
    assert row[header.index("waiting")] == "2"
    gauge = next(
        f for f in families(compute_snapshot(ZeroLossMessageService())) if f.name == "zeroloss_messages"
    )
    waiting = {s.labels["queue"]: s.value for s in gauge.samples if s.labels["status"] == "waiting"}
    assert waiting == {"wfops.ok": 2, "wfops.flaky": 0}


def test_cancel_a_workflow_cancels_every_unfinished_step() -> None:
    blocked_workflow()
    r = run("zeroloss_cancel", "--workflow", "ops")
    assert r.code == 0, r.err
    assert "ops/D: cancelled (cancelled)" in r.out and "ops/E: cancelled (cancelled)" in r.out
    assert "2 cancelled, 0 abort(s) requested, 0 not changed" in r.out
    assert statuses() == BLOCKED | {"D": "cancelled", "E": "cancelled"}
    actors = set(MessageEvent.objects.filter(reason="cancelled_by_operator").values_list("actor", flat=True))
    assert len(actors) == 1 and next(iter(actors)).startswith("cli:zeroloss_cancel@")
    again = run("zeroloss_cancel", "--workflow", "ops", "--json")
    assert again.code == 0
    assert json.loads(again.out) == {
        "workflow": "ops",
        "abort": True,
        "results": [],
        "counts": json.loads(again.out)["counts"],
        "ok": True,
    }
    assert "every step had finished already" in run("zeroloss_cancel", "--workflow", "ops").out


def test_cancel_a_workflow_aborts_its_running_step() -> None:
    blocked_workflow()
    HEALED.add("ops/B")
    service = ZeroLossMessageService(instance_id="w", ack_timeout=600)
    service.redrive_messages(["ops/B"], actor="op")
    assert service.claim_message("ops/B") is not None
    r = run("zeroloss_cancel", "--workflow", "ops", "--json")
    assert r.code == 0, r.err
    outcomes = {x["message_id"]: x["outcome"] for x in json.loads(r.out)["results"]}
    assert outcomes == {"ops/B": "abort_requested", "ops/D": "cancelled", "ops/E": "cancelled"}


def test_cancel_an_unknown_workflow_changes_nothing() -> None:
    blocked_workflow()
    before = ledger_state()
    for args, match in (
        (["--workflow", "nope"], "unknown workflow id: 'nope'; nothing was changed"),
        (["ops/D", "--workflow", "ops"], "not both"),
        ([], "or --workflow ID"),
    ):
        r = run("zeroloss_cancel", *args)
        assert r.code == 2, (args, r)
        assert match in r.err, r.err
    assert command_line("zeroloss_cancel", "--workflow", "nope").code == 2
    assert ledger_state() == before
