"""Workflows (docs/workflows.md): stored whole in the sender's transaction, each step released in the
transaction of its dependencies' fenced outcomes. Both passes (PostgreSQL and SQLite)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction

import zeroloss
from tests.ledger.test_fencing_guards import GUARDS, GuardBreached, catalogue_without
from tests.support import expire_leases
from zeroloss.exceptions import InvalidWorkflow, MessageConflict, WorkflowConflict
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.types import Completion, Verdict
from zeroloss.ledger.workflow_models import Dependency, FanIn, Workflow
from zeroloss.testing import drain

SEEN: list[tuple[str, Any]] = []


@zeroloss.handler("wf.a")
def step_a(delivery: Any) -> Any:
    SEEN.append((delivery.message_id, dict(delivery.upstream)))
    return {"from": delivery.message_id}


@zeroloss.handler("wf.b")
def step_b(delivery: Any) -> Any:
    SEEN.append((delivery.message_id, {k: (u.status, u.result) for k, u in delivery.upstream.items()}))
    if delivery.payload.get("fail"):
        raise zeroloss.Fail("told to")
    for i in range(delivery.payload.get("fan_out", 0)):
        delivery.workflow.step("wf.a", {"row": i}, name=f"row-{i}")
    return delivery.payload.get("n")


@zeroloss.handler("wf.tx", transactional=True)
def step_tx(delivery: Any) -> Any:
    # A write in the handler's transaction: committed with the acknowledgement and the release.
    zeroloss.send("wf.effects", {}, message_id=f"effect-{delivery.message_id.replace('/', '-')}")
    if delivery.payload.get("fail"):
        raise zeroloss.Fail("told to")
    return "done"


@zeroloss.handler("wf.effects")
def effects(delivery: Any) -> None:
    pass


def status(mid: str) -> str:
    return Message.objects.get(message_id=mid).status


def reasons(mid: str) -> list[str]:
    return list(MessageEvent.objects.for_message(mid).values_list("reason", flat=True))


@pytest.fixture(autouse=True)
def _clear() -> None:
    SEEN.clear()


def diamond(wid: str = "d", policy: str = "wait", fail_b: bool = False) -> zeroloss.Workflow:
    flow = zeroloss.Workflow(wid)
    a = flow.step("wf.a", {}, name="A")
    b = flow.step("wf.b", {"n": 1, "fail": fail_b}, name="B", after=[a], max_attempts=1)
    c = flow.step("wf.b", {"n": 2}, name="C", after=[a])
    flow.step("wf.b", {"n": 3}, name="D", after=[b, c], on_upstream_failure=policy)
    return flow


def _send_then_fail(wid: str) -> None:
    with transaction.atomic():
        diamond(wid).send()
        raise RuntimeError


def test_a_workflow_is_stored_whole_in_the_callers_transaction(db: None) -> None:
    with transaction.atomic():
        stored = diamond().send()
        assert stored.created
    assert {m: status(m) for m in stored.message_ids.values()} == {
        "d/A": "pending",
        "d/B": "waiting",
        "d/C": "waiting",
        "d/D": "waiting",
    }
    assert Dependency.objects.count() == 4
    assert reasons("d/D") == ["persisted"]
    # A rolled-back sender leaves nothing.
    with pytest.raises(RuntimeError):
        _send_then_fail("gone")
    assert not Message.objects.filter(workflow_id="gone").exists()
    assert not Workflow.objects.filter(workflow_id="gone").exists()


def test_steps_run_in_dependency_order_and_see_their_upstream_results(db: None) -> None:
    diamond().send()
    drain()
    assert {m: status(m) for m in ("d/A", "d/B", "d/C", "d/D")} == dict.fromkeys(
        ("d/A", "d/B", "d/C", "d/D"), "completed"
    )
    order = [m for m, _ in SEEN]
    assert order[0] == "d/A" and order[-1] == "d/D"
    d_saw = dict(SEEN)["d/D"]
    assert d_saw["B"] == ("completed", 1) and d_saw["C"] == ("completed", 2)
    assert reasons("d/D") == ["persisted", "dependencies_completed", "claimed", "acknowledged"]
    assert not FanIn.objects.exclude(remaining=0).exists()


def test_a_waiting_step_is_never_claimed(db: None) -> None:
    diamond().send()
    service = zeroloss.ZeroLossMessageService()
    assert [x.message_id for x in service.claim("wf.b", limit=10)] == []
    assert [x.message_id for x in service.claim("wf.a", limit=10)] == ["d/A"]


def test_a_stale_outcome_releases_nothing(db: None) -> None:
    """The release is fenced by the outcome's fence: an acknowledgement refused as stale (its
    lease expired and was swept) settles no dependency."""
    diamond().send()
    service = zeroloss.ZeroLossMessageService()
    (lease,) = service.claim("wf.a", limit=1)
    expire_leases(["d/A"])
    service.sweep()
    report = service.record_outcomes([Completion(lease, Verdict.ACKNOWLEDGE)])
    assert report.refused == ["d/A"]
    assert status("d/B") == status("d/C") == "waiting"
    assert not Dependency.objects.filter(settled_status__isnull=False).exists()


def test_the_last_of_two_dependencies_releases_once(db: None) -> None:
    diamond().send()
    service = zeroloss.ZeroLossMessageService()
    (a,) = service.claim("wf.a", limit=1)
    service.record_outcomes([Completion(a, Verdict.ACKNOWLEDGE)])
    b, c = sorted(service.claim("wf.b", limit=10), key=lambda x: x.message_id)
    service.record_outcomes([Completion(b, Verdict.ACKNOWLEDGE)])
    assert status("d/D") == "waiting"
    assert Message.objects.get(message_id="d/D").waiting_on == 1
    service.record_outcomes([Completion(c, Verdict.ACKNOWLEDGE)])
    assert status("d/D") == "pending"
    assert reasons("d/D").count("dependencies_completed") == 1


@pytest.mark.parametrize(
    ("policy", "expected"), [("wait", "waiting"), ("cancel", "cancelled"), ("run", "completed")]
)
def test_a_dead_dependency_under_each_policy(db: None, policy: str, expected: str) -> None:
    diamond(policy=policy, fail_b=True).send()
    drain()
    assert status("d/B") == "dead"
    assert status("d/D") == expected
    if policy == "run":
        assert dict(SEEN)["d/D"]["B"][0] == "dead"
    if policy == "wait":
        # A redrive that completes releases it: nothing was thrown away.
        Message.objects.filter(message_id="d/B").update(payload={"n": 1})
        zeroloss.ZeroLossMessageService().redrive_messages(["d/B"], actor="op")
        drain()
        assert status("d/D") == "completed"


def test_a_cancelled_workflow_cancels_every_live_step(db: None) -> None:
    diamond().send()
    results = zeroloss.cancel_workflow("d", actor="op")
    assert len(results) == 4
    assert {status(m) for m in ("d/A", "d/B", "d/C", "d/D")} == {"cancelled"}
    assert "cancelled_by_operator" in reasons("d/D")


def test_sending_a_workflow_again_is_idempotent_and_a_different_one_conflicts(db: None) -> None:
    first = diamond().send()
    again = diamond().send()
    assert first.created and not again.created
    assert Message.objects.filter(workflow_id="d").count() == 4
    other = zeroloss.Workflow("d")
    other.step("wf.a", {"x": 1}, name="A")
    with pytest.raises(WorkflowConflict, match="'d'"):
        other.send()
    assert Message.objects.filter(workflow_id="d").count() == 4


def test_a_workflow_sent_again_with_its_numbers_spelled_otherwise_is_the_same(db: None) -> None:
    """As for a message (its checksum): 1 and 1.0 are one payload, and so are 2 and "2" as keys."""
    sent = []
    for payload in ({"v": 1, 2: "a"}, {"v": 1.0, "2": "a"}):
        flow = zeroloss.Workflow("n")
        flow.step("wf.a", payload, name="A")
        sent.append(flow.send())
    assert sent[0].created and not sent[1].created
    assert Message.objects.get(message_id="n/A").payload == {"v": 1, "2": "a"}


def _build_invalid(flow: zeroloss.Workflow, case: str) -> None:
    if case == "cycle":
        flow.step("wf.a", {}, name="x", after=["y"])
        flow.step("wf.a", {}, name="y", after=["x"])
    elif case == "unknown":
        flow.step("wf.a", {}, name="x", after=["nope"])
    elif case == "other-workflow":
        elsewhere = zeroloss.Workflow("else").step("wf.a", {})
        flow.step("wf.a", {}, after=[elsewhere])
    elif case == "duplicate-name":
        flow.step("wf.a", {}, name="x")
        flow.step("wf.a", {}, name="x")
    elif case == "policy":
        flow.step("wf.a", {}, on_upstream_failure="retry")
    flow.send()


@pytest.mark.parametrize("case", ["cycle", "unknown", "other-workflow", "duplicate-name", "policy", "empty"])
def test_invalid_workflows_raise_a_typed_error_and_store_nothing(db: None, case: str) -> None:
    with pytest.raises(InvalidWorkflow):
        _build_invalid(zeroloss.Workflow("bad"), case)
    assert not Message.objects.exists()
    assert not Workflow.objects.exists()


def test_a_step_id_taken_by_another_message_conflicts_and_stores_nothing(db: None) -> None:
    zeroloss.send("wf.a", {}, message_id="d/C")
    flow = diamond()
    with pytest.raises(MessageConflict):
        flow.send()
    assert list(Message.objects.values_list("message_id", flat=True)) == ["d/C"]
    assert not Workflow.objects.exists()


def test_a_running_step_adds_steps_its_dependents_wait_for(db: None) -> None:
    flow = zeroloss.Workflow("up")
    split = flow.step("wf.b", {"fan_out": 3}, name="split")
    flow.step("wf.b", {"n": 9}, name="summary", after=[split])
    flow.send()
    drain()
    rows = [m for m, _ in SEEN]
    assert rows[0] == "up/split" and rows[-1] == "up/summary"
    assert sorted(rows[1:-1]) == ["up/row-0", "up/row-1", "up/row-2"]
    assert set(dict(SEEN)["up/summary"]) >= {"split", "row-0", "row-1", "row-2"}


def test_a_group_of_250_then_one_callback(db: None) -> None:
    """More dependencies than one fan-in group: the callback waits for every member."""
    flow = zeroloss.chord([("wf.a", {"i": i}) for i in range(250)], ("wf.b", {"n": 0}), workflow_id="big")
    flow.send()
    # 32 rows (blocks of 8 members take the rows in turn): claims made side by side by several
    # workers decrement different rows.
    assert Message.objects.get(message_id="big/callback").waiting_on == 32
    assert sum(FanIn.objects.values_list("remaining", flat=True)) == 250
    assert FanIn.objects.count() == 32
    blocks = Dependency.objects.filter(upstream__in=[f"big/wf.a-{i}" for i in (0, 7, 8, 16, 256 - 8)])
    assert sorted(blocks.values_list("fanin", flat=True)) == [0, 0, 1, 2, 31]
    drain(max_attempts=10_000)
    assert status("big/callback") == "completed"
    assert [m for m, _ in SEEN][-1] == "big/callback"


def test_chain_runs_one_after_another(db: None) -> None:
    zeroloss.chain(("wf.a", {}), ("wf.b", {"n": 1}), ("wf.a", {}), workflow_id="c").send()
    drain()
    assert [m for m, _ in SEEN] == ["c/wf.a-0", "c/wf.b-1", "c/wf.a-2"]


def test_the_sweep_dead_lettering_a_step_settles_its_dependents(db: None) -> None:
    diamond(policy="cancel").send()
    service = zeroloss.ZeroLossMessageService()
    (a,) = service.claim("wf.a", limit=1)
    service.record_outcomes([Completion(a, Verdict.ACKNOWLEDGE)])
    for lease in service.claim("wf.b", limit=10):
        if lease.message_id == "d/B":
            expire_leases(["d/B"])
    service.sweep()
    assert status("d/B") == "dead"
    assert status("d/D") == "cancelled"
    assert "upstream_failed" in reasons("d/D")


# -- the release's fence is its outcome's: each guard removed from the acknowledgement lets a
# stale outcome release a dependent (the checks below notice it) ---------------------------------


def _stale_by_token(service: zeroloss.ZeroLossMessageService) -> Completion:
    (stale,) = service.claim("wf.a", limit=1)
    expire_leases(["d/A"])
    service.sweep()
    assert [x.message_id for x in service.claim("wf.a", limit=1)] == ["d/A"]  # held by another now
    return Completion(stale, Verdict.ACKNOWLEDGE)


def _stale_by_status(service: zeroloss.ZeroLossMessageService) -> Completion:
    (lease,) = service.claim("wf.a", limit=1)
    Message.objects.filter(message_id="d/A").update(status=Status.PENDING)  # moved on, lease columns kept
    return Completion(lease, Verdict.ACKNOWLEDGE)


def _stale_by_expiry(service: zeroloss.ZeroLossMessageService) -> Completion:
    (lease,) = service.claim("wf.a", limit=1)
    expire_leases(["d/A"])
    return Completion(lease, Verdict.ACKNOWLEDGE)


STALE = {"token": _stale_by_token, "status": _stale_by_status, "expiry": _stale_by_expiry}


def _stale_ack_releases_nothing(kind: str) -> None:
    diamond().send()
    service = zeroloss.ZeroLossMessageService()
    completion = STALE[kind](service)
    service.record_outcomes([completion])
    released = Message.objects.filter(message_id__in=["d/B", "d/C"]).exclude(status=Status.WAITING)
    if released.exists():
        raise GuardBreached(
            f"a stale acknowledgement ({kind}) released {list(released.values_list('message_id'))}"
        )


@pytest.mark.parametrize("kind", sorted(STALE))
def test_a_stale_acknowledgement_releases_no_dependent(db: None, kind: str) -> None:
    _stale_ack_releases_nothing(kind)


@pytest.mark.parametrize("kind", sorted(STALE))
def test_each_guard_of_the_acknowledgement_fences_the_release(db: None, kind: str) -> None:
    """Removing the ACK's token, status or expiry guard lets the stale outcome release B and C."""
    guard = next(g for g in GUARDS if g.id == f"ACK-{kind}")
    with catalogue_without(guard), pytest.raises(GuardBreached):
        _stale_ack_releases_nothing(kind)


@pytest.mark.postgres_only  # SQLite has one writer: two transactions never interleave there
@pytest.mark.django_db(transaction=True)
def test_two_steps_adding_steps_to_one_dependent_at_once_both_land() -> None:
    """Two running steps that the same dependent waits for each add a step, in transactions that
    overlap: the second waits for the first's lock on the dependent, then takes the next group."""
    import threading

    from django.db import connection, connections

    from tests.support.waiting import wait_until
    from zeroloss.ledger.workflow_graph import StepSpec

    service = zeroloss.ZeroLossMessageService()
    service.workflows.store(
        "fan",
        [
            StepSpec("s1", "wf.a", {}),
            StepSpec("s2", "wf.a", {}),
            StepSpec("d", "wf.a", {}, after=("s1", "s2")),
        ],
    )
    first_added = threading.Event()
    errors: list[BaseException] = []

    def add(parent: str, name: str, hold: bool) -> None:
        try:
            with transaction.atomic():
                zeroloss.ZeroLossMessageService().workflows.add_steps(
                    f"fan/{parent}", "fan", [StepSpec(name, "wf.a", {})]
                )
                if hold:
                    first_added.set()
                    # Hold the dependent's lock until the other transaction waits for it.
                    with connection.cursor() as cursor:
                        wait_until(lambda: _a_lock_is_awaited(cursor), timeout=10)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    t1 = threading.Thread(target=add, args=("s1", "x1", True))
    t1.start()
    assert first_added.wait(10)
    t2 = threading.Thread(target=add, args=("s2", "x2", False))
    t2.start()
    t1.join(20)
    t2.join(20)
    assert not errors, errors
    d = Message.objects.get(message_id="fan/d")
    assert d.waiting_on == 3  # its first group, and one group per added step
    assert sorted(FanIn.objects.filter(downstream=d.pk).values_list("fanin", "remaining")) == [
        (0, 2),
        (1, 1),
        (2, 1),
    ]


def _a_lock_is_awaited(cursor: Any) -> bool:
    cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
    return bool(cursor.fetchone()[0])


@pytest.mark.parametrize("verdict", ["acknowledge", "fail"])
def test_the_one_at_a_time_outcomes_settle_a_step_too(db: None, verdict: str) -> None:
    """service.acknowledge / service.fail (one message, no lease object): a step's dependents are
    settled in the same transaction as with record_outcomes."""
    flow = zeroloss.Workflow("one")
    a = flow.step("wf.a", {}, name="A", max_attempts=1)
    flow.step("wf.a", {}, name="X", after=[a], on_upstream_failure="cancel")
    flow.send()
    service = zeroloss.ZeroLossMessageService()
    lease = service.claim_message("one/A")
    assert lease is not None
    if verdict == "acknowledge":
        assert service.acknowledge("one/A", lease.token)
        assert status("one/X") == "pending"
    else:
        assert service.fail("one/A", lease.token, "no")
        assert status("one/A") == "dead"
        assert status("one/X") == "cancelled"


def test_steps_on_queues_of_two_databases_are_refused(db: None, settings: Any) -> None:
    """A step is released in its dependencies' outcome's transaction: one database per workflow."""
    settings.ZEROLOSS = {**settings.ZEROLOSS, "QUEUE_DATABASES": {"wf.b": "elsewhere"}}
    flow = zeroloss.Workflow("split")
    flow.step("wf.a", {}, name="A")
    with pytest.raises(InvalidWorkflow, match="share one database"):
        flow.step("wf.b", {}, name="B", after=["A"])
    assert not Message.objects.exists()


@pytest.mark.parametrize("fail", [False, True])
def test_a_transactional_steps_writes_acknowledgement_and_release_commit_together(
    db: None, fail: bool
) -> None:
    flow = zeroloss.Workflow("tx")
    first = flow.step("wf.tx", {"fail": fail}, name="first", max_attempts=1)
    flow.step("wf.a", {}, name="then", after=[first])
    flow.send()
    drain("wf.tx")
    effect = Message.objects.filter(message_id="effect-tx-first")
    if fail:
        assert status("tx/first") == "dead"
        assert not effect.exists()  # rolled back with the handler's transaction
        assert status("tx/then") == "waiting"
    else:
        assert status("tx/first") == "completed"
        assert effect.count() == 1
        assert status("tx/then") == "pending"
        assert Message.objects.get(message_id="tx/first").result == "done"
