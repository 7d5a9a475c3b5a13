"""``manage.py zeroloss_queue pause|resume|limit|show`` (issue 27, part A; docs/control.md).

No separate process: the command line runs in-process (``command_line``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.cli import command_line, run
from zeroloss.ledger import control
from zeroloss.ledger.models import QueueControl
from zeroloss.ledger.service import ZeroLossMessageService

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "demo.record"  # a handler of the example project


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    control._CONTROLLED.clear()
    yield
    control._CONTROLLED.clear()


def show() -> list[dict[str, object]]:
    result = run("zeroloss_queue", "show", "--json")
    assert result.code == 0, result
    return list(json.loads(result.out)["queues"])


def test_pause_resume_and_show():
    assert run("zeroloss_queue", "show").out.strip() == "no queue is paused or limited"
    result = run("zeroloss_queue", "pause", QUEUE)
    assert (
        result.code == 0 and result.out.strip() == f"{QUEUE}: paused, concurrency unlimited, rate unlimited"
    )
    ZeroLossMessageService().persist_message("m1", QUEUE, {})
    (row,) = show()
    assert row["paused"] is True and row["pending"] == 1
    assert str(row["changed_by"]).startswith("cli:zeroloss_queue@")
    assert ZeroLossMessageService().claim(QUEUE, limit=5) == []
    result = run("zeroloss_queue", "resume", QUEUE, "--json")
    assert result.code == 0 and json.loads(result.out)["queue"]["paused"] is False
    assert len(ZeroLossMessageService().claim(QUEUE, limit=5)) == 1


def test_limit_sets_keeps_and_clears_overrides(settings):
    settings.ZEROLOSS = {**settings.ZEROLOSS, "QUEUES": {QUEUE: {"concurrency": 5}}}
    (row,) = show()
    assert (row["concurrency"], row["concurrency_override"], row["rate"]) == (5, None, None)
    assert run("zeroloss_queue", "limit", QUEUE, "--concurrency", "2", "--rate", "10/s").code == 0
    assert run("zeroloss_queue", "limit", QUEUE, "--rate", "600/m").code == 0  # concurrency kept
    (row,) = show()
    assert (row["concurrency"], row["rate"], row["rate_override"]) == (2, "600/m", "600/m")
    table = run("zeroloss_queue", "show").out
    assert "600/m" in table and "concurrency" in table
    assert run("zeroloss_queue", "limit", QUEUE, "--clear").code == 0
    (row,) = show()
    assert (row["concurrency"], row["concurrency_override"], row["rate"]) == (5, None, None)
    assert "5 (settings)" in run("zeroloss_queue", "show").out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("pause", "no.such.queue"), "unknown queue 'no.such.queue': no handler of this process"),
        (("pause", "bad queue"), "queue_name 'bad queue' may only use"),
        (("pause",), "pause needs a QUEUE"),
        (("show", QUEUE), "show takes no QUEUE"),
        (("limit", QUEUE), "limit needs --concurrency N, --rate R or --clear"),
        (
            ("limit", QUEUE, "--rate", "10/d"),
            '--rate must be "N/s", "N/m" or "N/h" (e.g. "10/s"), got \'10/d\'',
        ),
        (("limit", QUEUE, "--rate", "0/s"), "--rate must be"),
        (("limit", QUEUE, "--concurrency", "0"), "--concurrency must be an integer from 1, got '0'"),
        (("limit", QUEUE, "--concurrency", "two"), "--concurrency must be an integer from 1"),
        (("limit", QUEUE, "--clear", "--rate", "1/s"), "--clear takes no --concurrency or --rate"),
        (("pause", QUEUE, "--rate", "1/s"), "--concurrency, --rate and --clear are options of limit"),
    ],
)
def test_bad_input_is_exit_2_and_changes_nothing(args, message):
    result = run("zeroloss_queue", *args)
    assert result.code == 2, result
    assert message in result.err, result.err
    assert not QueueControl.objects.exists()


def test_the_command_line():
    proc = command_line("zeroloss_queue", "limit", QUEUE, "--concurrency", "3")
    assert proc.code == 0, proc.err
    assert proc.out.strip() == f"{QUEUE}: not paused, concurrency 3, rate unlimited"
    proc = command_line("zeroloss_queue", "pause", "nope")
    assert proc.code == 2 and "error: unknown queue 'nope'" in proc.err
    assert QueueControl.objects.get(queue_name=QUEUE).concurrency == 3


def test_status_dashboard_and_metrics_show_what_is_paused_and_limited():
    from zeroloss.ops import dashboard
    from zeroloss.ops.metrics import families
    from zeroloss.ops.snapshot import compute_snapshot

    service = ZeroLossMessageService()
    service.persist_message("m1", QUEUE, {})
    service.pause_queue(QUEUE)
    service.limit_queue("demo.record_tx", concurrency=2, rate="10/s")  # no message yet: listed still
    data = json.loads(run("zeroloss_status", "--json", "--no-cache").out)
    by = {q["name"]: q for q in data["queues"]}
    assert (by[QUEUE]["paused"], by[QUEUE]["concurrency"], by[QUEUE]["rate"]) == (True, None, None)
    assert (by["demo.record_tx"]["paused"], by["demo.record_tx"]["concurrency"]) == (False, 2)
    assert by["demo.record_tx"]["rate"] == "10/s"
    text = run("zeroloss_status", "--no-cache").out
    assert f"queue {QUEUE}: paused" in text
    assert "queue demo.record_tx: concurrency 2, rate 10/s" in text
    rows = {r.name: r for r in dashboard.collect(service).queues}
    assert rows[QUEUE].paused and rows["demo.record_tx"].concurrency == 2
    metrics = {m.name: m for m in families(compute_snapshot(service))}
    samples = {
        (m, s.labels["queue"]): s.value for m in metrics for s in metrics[m].samples if "queue" in s.labels
    }
    assert samples[("zeroloss_queue_paused", QUEUE)] == 1
    assert samples[("zeroloss_queue_paused", "demo.record_tx")] == 0
    assert samples[("zeroloss_queue_concurrency_limit", "demo.record_tx")] == 2
    assert samples[("zeroloss_queue_rate_limit_per_second", "demo.record_tx")] == 10.0
    assert ("zeroloss_queue_concurrency_limit", QUEUE) not in samples


def test_admin_lists_queue_controls_and_pauses_and_resumes_after_confirming(client):
    from django.contrib.auth.models import Permission, User
    from django.urls import reverse

    service = ZeroLossMessageService()
    service.limit_queue(QUEUE, concurrency=2)
    url = reverse("admin:zeroloss_queuecontrol_changelist")
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_queuecontrol"))
    client.force_login(viewer)
    page = client.get(url)
    assert page.status_code == 200 and QUEUE in page.content.decode()
    # Without the change permission the actions are not offered, and a forged POST does nothing.
    assert 'value="pause"' not in page.content.decode()
    client.post(url, {"action": "pause", "_selected_action": [QUEUE], "post": "yes"})
    assert QueueControl.objects.get(queue_name=QUEUE).paused is False

    operator = User.objects.create_user("ops", password="pw", is_staff=True)
    operator.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_queuecontrol", "change_queuecontrol"])
    )
    client.force_login(operator)
    asked = client.post(url, {"action": "pause", "_selected_action": [QUEUE]})
    assert asked.status_code == 200 and "Pause these queues?" in asked.content.decode()
    assert QueueControl.objects.get(queue_name=QUEUE).paused is False  # asked, not done
    client.post(url, {"action": "pause", "_selected_action": [QUEUE], "post": "yes"})
    row = QueueControl.objects.get(queue_name=QUEUE)
    assert row.paused is True and row.changed_by == "ops"
    client.post(url, {"action": "resume", "_selected_action": [QUEUE], "post": "yes", "select_across": "0"})
    assert QueueControl.objects.get(queue_name=QUEUE).paused is False
