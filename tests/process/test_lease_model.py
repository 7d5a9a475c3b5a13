"""The lease protocol's model (``tests/model/lease.pml``), checked by spin.

One verifier is generated and compiled per number of workers; every configuration and every
mutant is chosen when it starts (``ZL_*`` environment variables, read by the model's
``init``), so a run costs no compile. The real protocol must pass every check with no error
and a complete search; each mutant (a broken variant of the protocol) must fail, on the
property it breaks — so the model is not vacuous. ``docs/guarantees.md`` ("What the model
checker proves") says what this proves and what it does not.

By hand::

    cd tests/model && spin -DW=2 -a lease.pml && gcc -O2 -DNFAIR=3 -o pan pan.c
    ZL_KINDS=1 ./pan -N safety                  # safety: assertions (P1-P4)
    ZL_KINDS=2 ZL_CUTS=0 ./pan -a -f -N terminal    # liveness under weak fairness (P5)
    ZL_MUTANT=no_deadline ZL_KINDS=1 ./pan -N safety   # a mutant: errors: 1
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.spin import ACCEPTANCE_CYCLE, Check, Outcome, run_checks
from zeroloss.core.states import TRANSITIONS

pytestmark = [pytest.mark.postgres_only, pytest.mark.once]

MODEL = Path(__file__).resolve().parents[1] / "model" / "lease.pml"

#: Bounds of a configuration: which queues, and how many faults and operator actions.
NO_FAULTS = {"ZL_CRASHES": "0", "ZL_CUTS": "0", "ZL_REQUEUES": "0", "ZL_REDRIVES": "0"}
PLAIN, TRANSACTIONAL, ONE_OF_EACH = "0", "1", "2"


def bounds(kinds: str, **counts: int) -> dict[str, str]:
    env = dict(NO_FAULTS, ZL_KINDS=kinds)
    env.update({f"ZL_{k.upper()}": str(v) for k, v in counts.items()})
    return env


#: The property each fragment names (spin prints the violated assertion's expression).
P1_COMPLETED_WITH_EFFECT = "(st[i]!=2)||("
P2_ONE_LIVE_LEASE = "lease[i]>=wl["
P3_FENCED = "!(stale["
P4_EFFECT_WITH_ACK = "((st[i]==2)==(effc[i]==1))"
P5_CYCLE = ACCEPTANCE_CYCLE

CHECKS = [
    # The protocol: safety with faults, for each handler kind (batches of two). A crash and a
    # cut in one run are twice the states (690,953 plain, 1,043,185 transactional; by hand).
    Check("plain-crash", 2, bounds(PLAIN, crashes=1)),
    Check("plain-cut", 2, bounds(PLAIN, cuts=1)),
    Check("transactional-crash", 2, bounds(TRANSACTIONAL, crashes=1)),
    Check("transactional-cut", 2, bounds(TRANSACTIONAL, cuts=1)),
    # The operator: force requeues and redrives (attempts reset), both handler kinds.
    Check("requeue-redrive", 2, bounds(ONE_OF_EACH, requeues=1, redrives=1)),
    # Three workers, one crash.
    Check("three-workers-crash", 3, bounds(ONE_OF_EACH, crashes=1)),
    # Liveness under weak fairness.
    Check("terminal-crash", 2, bounds(ONE_OF_EACH, crashes=1), liveness=True),
    Check("terminal-transactional-batches", 2, bounds(TRANSACTIONAL), liveness=True),
    # Mutants: each must be caught, on its property.
    Check("mutant-ack-no-expiry", 2, dict(bounds(PLAIN), ZL_MUTANT="ack_no_expiry"), finds=P3_FENCED),
    Check(
        "mutant-renew-no-token",
        2,
        dict(bounds(TRANSACTIONAL, requeues=1), ZL_MUTANT="renew_no_token"),
        finds=P2_ONE_LIVE_LEASE,
    ),
    Check("mutant-no-deadline", 2, dict(bounds(TRANSACTIONAL), ZL_MUTANT="no_deadline"), finds=P3_FENCED),
    Check(
        "mutant-no-deadline-stuck",
        2,
        dict(bounds(ONE_OF_EACH, crashes=1), ZL_MUTANT="no_deadline"),
        liveness=True,
        finds=P5_CYCLE,
        ignore_asserts=True,
    ),
    Check(
        "mutant-handler-commits",
        2,
        dict(bounds(TRANSACTIONAL), ZL_MUTANT="handler_commits"),
        finds=P4_EFFECT_WITH_ACK,
    ),
    Check(
        "mutant-handler-rolls-back",
        2,
        dict(bounds(TRANSACTIONAL), ZL_MUTANT="handler_rolls_back"),
        finds=P1_COMPLETED_WITH_EFFECT,
    ),
    Check(
        "mutant-revive-no-token",
        2,
        dict(bounds(PLAIN), ZL_MUTANT="revive_no_token"),
        finds=P2_ONE_LIVE_LEASE,
    ),
    Check(
        "mutant-keeper-forgets",
        2,
        dict(bounds(PLAIN), ZL_MUTANT="keeper_forgets"),
        liveness=True,
        finds=P5_CYCLE,
    ),
]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    root = tmp_path_factory.mktemp("lease-model")
    return run_checks(MODEL, CHECKS, root, liveness_claim="terminal", title="lease model")


@pytest.mark.parametrize("check", [c for c in CHECKS if c.finds is None], ids=lambda c: c.name)
def test_the_protocol_keeps_every_property(outcomes: dict[str, Outcome], check: Check) -> None:
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


_STATUS = {"PEND": "pending", "PROC": "processing", "COMP": "completed", "DEAD": "dead"}
#: Edges of the state machine the model leaves out: the first (both messages are accepted
#: before the model starts), and an operator's dead-lettering (it moves a message to a
#: terminal state, where nothing else can move it: it adds nothing the model could refute).
NOT_MODELLED = {
    ("", "pending", "persisted"),
    ("pending", "dead", "dead_lettered_by_operator"),
    ("processing", "dead", "dead_lettered_by_operator"),
    # An operator's cancel: terminal, like the dead-lettering above.
    ("pending", "cancelled", "cancelled_by_operator"),
    # An abort's outcome: a fenced outcome statement like the acknowledgement (token, status,
    # unexpired lease), to a terminal state. Not in lease.pml yet: tests/ledger/test_fencing_guards.py
    # and tests/ledger/test_state_machine.py check it.
    ("processing", "cancelled", "aborted"),
    # A handler's Snooze and Fail: fenced outcome statements with the failure's guards (token,
    # status, unexpired lease). Not in lease.pml yet: tests/ledger/test_fencing_guards.py and
    # tests/ledger/test_state_machine.py check them.
    ("processing", "pending", "snoozed"),
    ("processing", "dead", "dead_lettered_by_handler"),
}


def test_every_move_of_the_model_is_an_edge_of_the_state_machine() -> None:
    """The model's moves (``MOVE(m, FROM, TO, reason)``) are zeroloss.core.states.TRANSITIONS'."""
    moves = re.findall(r"MOVE\(\w+, (PEND|PROC|COMP|DEAD), (\w+), (\w+)\)", MODEL.read_text())
    modelled = {(_STATUS[a], _STATUS[b], reason) for a, b, reason in moves}
    # A workflow step's edges (to or from "waiting") are tests/model/workflow.pml's, checked by
    # tests/process/test_workflow_model.py.
    edges = {
        (t.source, t.target, t.reason.value) for t in TRANSITIONS if "waiting" not in (t.source, t.target)
    }
    assert len(moves) >= 9 and modelled - edges == set(), (
        f"the model moves a message along an edge the ledger does not have: {modelled - edges}"
    )
    assert edges - modelled == NOT_MODELLED, (
        "an edge of zeroloss.core.states.TRANSITIONS the model does not cover (add it to lease.pml, or say why not): "
        f"{edges - modelled - NOT_MODELLED}"
    )
