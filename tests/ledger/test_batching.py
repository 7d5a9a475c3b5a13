"""Batched outcomes with real processes: what a SIGKILL mid-batch costs, and bulk send."""

from __future__ import annotations

import collections

import pytest
from django.db import transaction

import zeroloss
from project.demo.models import HandledRecord
from tests.support import expire_leases
from tests.support.processes import db_worker
from zeroloss.exceptions import InvalidPayload
from zeroloss.ledger.models import Message, MessageEvent, Status
from zeroloss.ledger.service import ZeroLossMessageService, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.slow
@pytest.mark.process
def test_a_sigkill_mid_batch_reruns_at_most_the_unrecorded_outcomes_each_visible_in_the_audit():
    service = ZeroLossMessageService()
    service.persist_messages([(f"b{i}", "demo.record", {"i": i, "sleep": 0.01}) for i in range(400)])
    # Outcomes wait for a batch of 1,000 or 60 s: whatever the worker handled is unrecorded.
    worker = db_worker(
        "--queue",
        "demo.record",
        "--batch-size",
        "50",
        ZEROLOSS_SETTINGS_JSON='{"ACK_FLUSH_INTERVAL": 60, "ACK_BATCH_SIZE": 1000}',
    )
    try:
        assert wait_until(lambda: HandledRecord.objects.count() >= 30, timeout=60), worker.text
        worker.sigkill_group()
    finally:
        worker.terminate()
    ran_before = collections.Counter(HandledRecord.objects.values_list("message_id", flat=True))
    recorded = set(
        MessageEvent.objects.filter(reason__in=["acknowledged", "failed"]).values_list(
            "message__message_id", flat=True
        )
    )
    unrecorded = set(ran_before) - recorded
    assert unrecorded, "the kill found every outcome already recorded: nothing was at stake"
    # Their leases lapse (moved, as time would), the sweep puts them back, another worker runs them.
    expire_leases()
    swept = set(service.sweep().requeued)
    second = db_worker("--queue", "demo.record", "--burst")
    try:
        assert second.popen.wait(timeout=180) == 0, second.text
    finally:
        second.terminate()
    runs = collections.Counter(HandledRecord.objects.values_list("message_id", flat=True))
    assert set(runs) == {f"b{i}" for i in range(400)}  # nothing lost
    reruns = {mid for mid, n in runs.items() if n > 1}
    assert reruns <= unrecorded  # only outcomes the kill lost ran again
    assert len(reruns) <= len(unrecorded)
    expired = set(
        MessageEvent.objects.filter(reason="lease_expired").values_list("message__message_id", flat=True)
    )
    assert reruns <= expired and reruns <= swept  # and each re-run shows in the audit trail
    assert Message.objects.filter(status=Status.COMPLETED).count() == 400


class TestSendMany:
    def test_stores_all_in_the_callers_transaction_or_none(self):
        with transaction.atomic():
            messages = zeroloss.send_many("demo.record", [{"n": n} for n in range(300)])
            assert len(messages) == 300 and Message.objects.count() == 300
        assert MessageEvent.objects.filter(reason="persisted").count() == 300

        def rolled_back() -> None:
            with transaction.atomic():
                zeroloss.send_many("demo.record", [{"n": n} for n in range(10)])
                raise RuntimeError("the request failed")

        with pytest.raises(RuntimeError):
            rolled_back()
        assert Message.objects.count() == 300

    def test_a_bad_payload_is_named_and_nothing_is_stored(self):
        payloads = [{"n": 1}, {"n": 2}, {"bad": float("nan")}, {"n": 4}]
        with pytest.raises(InvalidPayload, match=r"item 2 \('m2'\).*Nothing of the batch was stored"):
            zeroloss.send_many("demo.record", payloads, message_ids=[f"m{i}" for i in range(4)])
        assert not Message.objects.exists()

    def test_idempotent_by_message_id_like_send(self):
        ids = [f"i{n}" for n in range(5)]
        first = zeroloss.send_many("demo.record", [{"n": n} for n in range(5)], message_ids=ids)
        again = zeroloss.send_many("demo.record", [{"n": n} for n in range(5)], message_ids=ids)
        assert [m.pk for m in again] == [m.pk for m in first]
        assert MessageEvent.objects.filter(reason="persisted").count() == 5
