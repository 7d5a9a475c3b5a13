"""The release of a workflow's steps (``tests/model/workflow.pml``), checked by spin.

One verifier, every configuration and mutant chosen when it starts (``ZL_*`` environment
variables, read by the model's ``init``). The protocol must pass every check with no error and
a complete search; each mutant (a broken variant of it) must fail, on the property it breaks —
so the model is not vacuous. ``docs/guarantees.md`` ("What the model checker proves") says what
this proves, its bounds and its run time.

By hand::

    cd tests/model && spin -a workflow.pml && gcc -O2 -DNFAIR=3 -o pan pan.c
    ZL_POLICY=1 ./pan -N safety                            # safety: W1-W4
    ZL_POLICY=0 ./pan -a -f -N done                        # liveness under weak fairness (W5)
    ZL_MUTANT=release_no_token ./pan -N safety             # a mutant: errors: 1
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.spin import ACCEPTANCE_CYCLE, Check, Outcome, run_checks
from zeroloss.core.states import TRANSITIONS

pytestmark = [pytest.mark.postgres_only, pytest.mark.once]

MODEL = Path(__file__).resolve().parents[1] / "model" / "workflow.pml"

#: The failure policies (``on_upstream_failure``): B's and C's, and D's (the same unless given).
WAIT, RUN, CANCEL = "0", "1", "2"
NONE = {
    "ZL_BATCH": "0",
    "ZL_CRASHES": "0",
    "ZL_CUTS": "0",
    "ZL_REQUEUES": "0",
    "ZL_REDRIVES": "0",
    "ZL_CANCELS": "0",
    "ZL_DEADLETTERS": "0",
}


def bounds(
    policy: str, *, then: str | None = None, fanin: int = 2, maxatt: int = 2, **counts: int
) -> dict[str, str]:
    """A configuration: the policies (B's and C's, then D's), D's fan-in groups (one of two, or
    two of one), attempts per step, and how many crashes, cuts, force requeues and redrives
    (none unless given), operator cancels (of a pending or waiting step) and dead-letterings (of
    a pending or running one); ``batch=1`` lets a worker claim B and C together."""
    env = dict(NONE, ZL_POLICY=policy, ZL_POLICY_D=then or policy, ZL_FANIN=str(fanin), ZL_MAXATT=str(maxatt))
    env.update({f"ZL_{k.upper()}": str(v) for k, v in counts.items()})
    return env


#: What spin prints of each property's violated assertion (the model names each).
W1_NEVER_EARLY = "assertion violated never_early"
W2_RELEASED_ONCE = "assertion violated released_once"
W3_COUNTED_RIGHT = "assertion violated counted_right"
W4_FRESH_LEASE = "assertion violated fresh_lease"
W4_FROM_FENCED_MOVE = "assertion violated from_fenced_move"
W5_CYCLE = ACCEPTANCE_CYCLE

CHECKS = [
    # Safety (W1-W4), each policy, with faults; D's dependencies one group of two, or two
    # groups of one.
    Check("wait-crash-redrive", 2, bounds(WAIT, crashes=1, redrives=1)),
    Check("wait-groups-of-one-cut-redrive", 2, bounds(WAIT, fanin=1, cuts=1, redrives=1)),
    Check("wait-requeue-crash", 2, bounds(WAIT, requeues=1, crashes=1)),
    Check("run-crash-redrive", 2, bounds(RUN, crashes=1, redrives=1)),
    Check("run-groups-of-one-cut", 2, bounds(RUN, fanin=1, maxatt=1, cuts=1, redrives=1)),
    Check("cancel-groups-of-one-crash-cut", 2, bounds(CANCEL, fanin=1, crashes=1, cuts=1)),
    # A mix: B's and C's policy, then D's. A cancel settles the cancelled step's edges in a
    # next round of the same transaction: under "run" they count (D released by A's death).
    Check("cancel-then-run-crash-redrive", 2, bounds(CANCEL, then=RUN, crashes=1, redrives=1)),
    Check("run-then-cancel-crash-redrive", 2, bounds(RUN, then=CANCEL, maxatt=1, crashes=1, redrives=1)),
    Check("wait-then-run-crash-redrive", 2, bounds(WAIT, then=RUN, crashes=1, redrives=1)),
    Check("cancel-then-wait-crash-redrive", 2, bounds(CANCEL, then=WAIT, crashes=1, redrives=1)),
    # Batches: a worker claims B and C together, their outcomes released in one transaction (a
    # group counts down by two; with groups of one, D by two groups).
    Check("wait-batches-crash-redrive", 2, bounds(WAIT, batch=1, crashes=1, redrives=1)),
    Check(
        "cancel-then-run-batches-groups-of-one-crash-redrive",
        2,
        bounds(CANCEL, then=RUN, batch=1, fanin=1, crashes=1, redrives=1),
    ),
    # The operator cancels a step (pending or waiting: cancel_workflow) and dead-letters one
    # (pending or running), each settling its dependents in its transaction.
    Check("wait-operator-crash", 2, bounds(WAIT, cancels=1, deadletters=1, crashes=1)),
    Check("run-operator-crash", 2, bounds(RUN, cancels=1, deadletters=1, crashes=1)),
    # Liveness under weak fairness (W5). A configuration with batches has every run of the
    # same one without (a worker may still claim one step).
    # Under "run" with a redrive too: 1,622,696 states, 97 s (by hand, docs/guarantees.md).
    Check("done-run-crash", 2, bounds(RUN, crashes=1), liveness=True),
    Check("done-cancel-groups-of-one-crash", 2, bounds(CANCEL, fanin=1, crashes=1), liveness=True),
    Check(
        "done-cancel-then-run-crash-redrive",
        2,
        bounds(CANCEL, then=RUN, maxatt=1, crashes=1, redrives=1),
        liveness=True,
    ),
    Check(
        "done-wait-batches-groups-of-one-crash-redrive",
        2,
        bounds(WAIT, batch=1, fanin=1, crashes=1, redrives=1),
        liveness=True,
    ),
    Check(
        "done-cancel-then-run-operator-crash",
        2,
        bounds(CANCEL, then=RUN, maxatt=1, cancels=1, deadletters=1, crashes=1),
        liveness=True,
    ),
    Check(
        "done-wait-then-run-crash-redrive",
        2,
        bounds(WAIT, then=RUN, maxatt=1, crashes=1, redrives=1),
        liveness=True,
    ),
    # Mutants: each must be caught, on its property.
    Check(
        "mutant-release-no-token", 2, dict(bounds(WAIT), ZL_MUTANT="release_no_token"), finds=W4_FRESH_LEASE
    ),
    Check(
        "mutant-release-no-status",
        2,
        dict(bounds(WAIT, requeues=1), ZL_MUTANT="release_no_status"),
        finds=W4_FRESH_LEASE,
    ),
    Check(
        "mutant-release-no-expiry", 2, dict(bounds(WAIT), ZL_MUTANT="release_no_expiry"), finds=W4_FRESH_LEASE
    ),
    Check(
        "mutant-release-refused",
        2,
        dict(bounds(WAIT), ZL_MUTANT="release_refused"),
        finds=W4_FROM_FENCED_MOVE,
    ),
    Check(
        "mutant-decrement-unlocked",
        2,
        dict(bounds(WAIT), ZL_MUTANT="decrement_unlocked"),
        finds=W3_COUNTED_RIGHT,
    ),
    Check(
        "mutant-decrement-unlocked-stuck",
        2,
        dict(bounds(WAIT), ZL_MUTANT="decrement_unlocked"),
        liveness=True,
        finds=W5_CYCLE,
        ignore_asserts=True,
    ),
    Check(
        "mutant-cancel-unsettled",
        2,
        dict(bounds(CANCEL, then=RUN, maxatt=1), ZL_MUTANT="cancel_unsettled"),
        liveness=True,
        finds=W5_CYCLE,
    ),
    Check(
        "mutant-count-once",
        2,
        dict(bounds(WAIT, batch=1), ZL_MUTANT="count_once"),
        finds=W3_COUNTED_RIGHT,
    ),
    Check(
        "mutant-release-not-waiting",
        2,
        dict(bounds(WAIT, cancels=1), ZL_MUTANT="release_not_waiting"),
        finds=W2_RELEASED_ONCE,
    ),
    Check(
        "mutant-settle-twice",
        2,
        dict(bounds(RUN, redrives=1), ZL_MUTANT="settle_twice"),
        finds=W1_NEVER_EARLY,
    ),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    root = tmp_path_factory.mktemp("workflow-model")
    return run_checks(MODEL, CHECKS, root, liveness_claim="done", title="workflow model")


@pytest.mark.parametrize("check", [c for c in CHECKS if c.finds is None], ids=lambda c: c.name)
def test_the_release_keeps_every_property(outcomes: dict[str, Outcome], check: Check) -> None:
    outcome = outcomes[check.name]
    assert outcome.errors == 0, f"{check.name}: spin found a violation:\n{outcome.output[-3000:]}"
    assert outcome.complete, f"{check.name}: the search did not complete:\n{outcome.output[-3000:]}"
    assert outcome.states > 1000, f"{check.name}: suspiciously few states:\n{outcome.output[-3000:]}"


@pytest.mark.parametrize("check", [c for c in CHECKS if c.finds is not None], ids=lambda c: c.name)
def test_each_mutant_is_caught_on_its_property(outcomes: dict[str, Outcome], check: Check) -> None:
    outcome = outcomes[check.name]
    assert outcome.errors > 0, f"{check.name}: spin found no violation:\n{outcome.output[-3000:]}"
    assert check.finds is not None and check.finds in outcome.output, (
        f"{check.name}: spin found another violation than {check.finds!r}:\n{outcome.output[-3000:]}"
    )


def test_each_guard_of_the_release_has_a_mutant() -> None:
    """The outcome's three fences (token, status, expiry), a release of only the rows the
    outcome moved, the counters' row locks, the settle-once filter, the settling of a cancelled
    step's edges, a batch's counts and the release's own status fence (waiting): removing any
    of them is a mutant the checks above run."""
    mutants = {c.env.get("ZL_MUTANT") for c in CHECKS}
    declared = re.search(r'names\[\] = \{"", (.*?), 0\}', MODEL.read_text(), re.S)
    assert declared, "workflow.pml no longer declares its mutants' names (zl_mutant)"
    assert {n.strip().strip('"') for n in declared.group(1).split(",")} == mutants - {None}


_STATUS = {
    "PEND": "pending",
    "PROC": "processing",
    "COMP": "completed",
    "DEAD": "dead",
    "CANC": "cancelled",
    "WAIT": "waiting",
}
#: A workflow step's edge the model leaves out: its first (the workflow is stored before the
#: model starts).
NOT_MODELLED = {("", "waiting", "persisted")}


def test_every_move_of_the_model_is_an_edge_of_the_state_machine() -> None:
    """The model's moves (``MOVE(m, FROM, TO, reason)``) are zeroloss.core.states.TRANSITIONS',
    and it covers every edge of a waiting step but the ones it says it leaves out."""
    moves = re.findall(r"MOVE\(\w+, (PEND|PROC|COMP|DEAD|CANC|WAIT), (\w+), (\w+)\)", MODEL.read_text())
    modelled = {(_STATUS[a], _STATUS[b], reason) for a, b, reason in moves}
    edges = {(t.source, t.target, t.reason.value) for t in TRANSITIONS}
    assert len(moves) >= 10 and modelled - edges == set(), (
        f"the model moves a step along an edge the ledger does not have: {modelled - edges}"
    )
    waiting = {e for e in edges if "waiting" in (e[0], e[1])}
    assert waiting - modelled == NOT_MODELLED, (
        "an edge of a waiting step the model does not cover (add it to workflow.pml, or say why not): "
        f"{waiting - modelled - NOT_MODELLED}"
    )
