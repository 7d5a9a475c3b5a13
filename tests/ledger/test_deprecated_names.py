"""The service's renamed methods (one verb per action): each old name still works, warns
``DeprecationWarning`` naming its successor, and is listed in docs/upgrading.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import expire_leases
from zeroloss.ledger.deprecated import RENAMED
from zeroloss.ledger.models import Message, Status
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ledger.types import Completion, Verdict

Q = "renamed-q"
UPGRADING = Path(__file__).resolve().parents[2] / "docs" / "upgrading.md"


def status(mid: str) -> str:
    return Message.objects.get(message_id=mid).status


def old(service: ZeroLossMessageService, name: str, *args: Any, **kwargs: Any) -> Any:
    """Call the old name ``name``: it must warn once, naming the new one, and return its result."""
    with pytest.warns(DeprecationWarning, match=f"{name}\\(\\) is deprecated") as caught:
        result = getattr(service, name)(*args, **kwargs)
    texts = [str(w.message) for w in caught if w.category is DeprecationWarning]
    assert texts == [
        f"ZeroLossMessageService.{name}() is deprecated and will be removed in zeroloss 0.4; "
        f"use {RENAMED[name]}()."
    ]
    assert caught[0].filename == __file__  # attributed to the caller: once per call site
    return result


@pytest.mark.django_db(transaction=True)
def test_each_old_name_warns_and_still_does_what_it_did() -> None:
    service = ZeroLossMessageService(instance_id="renamed", ack_timeout=600)
    service.persist_messages([(f"r{i}", Q, {"i": i}) for i in range(6)])
    Message.objects.filter(message_id="r1").update(max_attempts=1)  # its failure dead-letters it

    [first] = old(service, "claim_next", Q)
    assert first.message_id == "r0"
    assert old(service, "acknowledge_message", "r0", first.token) is True
    lease = old(service, "mark_processing", "r1")
    assert lease is not None and lease.message_id == "r1"
    assert old(service, "mark_failed", "r1", lease.token, "boom") is True
    assert status("r1") == Status.DEAD
    lease = service.claim_message("r2")
    assert lease is not None
    assert old(service, "release_lease", "r2", lease.token) is True
    assert status("r2") == Status.PENDING
    lease = service.claim_message("r3")
    assert lease is not None
    report = old(service, "complete", [Completion(lease, Verdict.ACKNOWLEDGE)])
    assert report.acknowledged == ["r3"]
    lease = service.claim_message("r4")
    assert lease is not None
    expire_leases(["r4"])
    assert old(service, "recover_orphaned_messages").requeued == ["r4"]
    assert old(service, "retry_message", "r1") is True  # the dead letter redriven
    assert status("r1") == Status.PENDING


def test_every_new_name_is_a_method_and_every_rename_is_in_the_upgrade_notes() -> None:
    text = UPGRADING.read_text(encoding="utf-8")
    for name, new in RENAMED.items():
        assert callable(getattr(ZeroLossMessageService, new)), new
        assert f"| `{name}` | `{new}` |" in text, f"docs/upgrading.md does not list {name} -> {new}"


def test_an_old_name_is_an_error_in_this_suite() -> None:
    """pyproject.toml's filterwarnings turn these warnings into errors in zeroloss's tests, so no
    caller (internal or test) is left on an old name; the test above expects them."""
    service = ZeroLossMessageService.__new__(ZeroLossMessageService)  # the warning comes first
    with pytest.raises(DeprecationWarning, match="use claim"):
        service.claim_next(Q)
