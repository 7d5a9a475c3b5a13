"""The operator's desk in a real browser: headless Chromium (Debian's package) via Playwright.

No browser is ever downloaded: Playwright drives ``/usr/bin/chromium`` (``ZEROLOSS_CHROMIUM``
overrides the path). A missing Chromium is a failure, never a skip. Screenshots go to the
test's tmp dir, and into ``ZEROLOSS_SCREENSHOTS_DIR`` when it is set (``docs/img/`` uses them).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connections

from tests.support import expire_leases
from zeroloss.ledger.models import Message, MessageEvent, QueueControl, Status
from zeroloss.ledger.service import ZeroLossMessageService

CHROMIUM = os.environ.get("ZEROLOSS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
OPERATOR_PERMS = (
    "view_message",
    "requeue_message",
    "force_requeue_message",
    "redrive_message",
    "view_replicationnode",
)


def ensure_chromium() -> None:
    """Debian's Chromium at :data:`CHROMIUM`, installed when missing as every Debian package the
    tests drive is (never a download of a browser build); a failure saying what to install
    otherwise. ``ZEROLOSS_CHROMIUM`` names a browser the test must find as it is."""
    from tests.support.debian import DebianPackageError, ensure_debian_package

    if "ZEROLOSS_CHROMIUM" not in os.environ:
        try:
            ensure_debian_package("chromium", [CHROMIUM], timeout=900)
        except DebianPackageError as exc:
            pytest.fail(f"Chromium not found at {CHROMIUM} and could not be installed: {exc}")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"Chromium not found at {CHROMIUM} (ZEROLOSS_CHROMIUM): point it at a Chromium binary, or "
            "unset it to have Debian's package installed. The browser tests never download a browser."
        )


@pytest.fixture
def browser_page(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    ensure_chromium()
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread; the ORM calls the test makes
    # between page steps are ordinary synchronous ones.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1360, "height": 900}, device_scale_factor=1)
            page = context.new_page()
            page.set_default_timeout(15_000)
            yield page
        finally:
            # ORM calls made while Playwright's loop runs get their own connection (Django's
            # connections are context-local); close it so the test database can be dropped.
            connections.close_all()
            browser.close()


class Shots:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        extra = os.environ.get("ZEROLOSS_SCREENSHOTS_DIR")
        self.extra = Path(extra) if extra else None
        self.taken: list[Path] = []

    def take(self, page: Any, name: str, *, full_page: bool = True) -> Path:
        path = self.tmp / name
        page.screenshot(path=str(path), full_page=full_page)
        assert path.stat().st_size > 10_000, f"{name} looks empty"
        if self.extra is not None:
            self.extra.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, self.extra / name)
        self.taken.append(path)
        return path


def make_ledger() -> dict[str, Any]:
    """A small, realistic ledger, made only through the service."""
    worker = ZeroLossMessageService(instance_id="worker-a:4711")
    worker.persist_messages(
        [(f"order-{i}-email", "emails", {"order": i, "to": f"customer{i}@example.com"}) for i in range(1, 25)]
    )
    worker.persist_messages(
        [(f"sms-{i}", "sms", {"to": f"+4420700{i:04d}", "text": "Your code"}) for i in range(1, 9)]
    )
    for lease in worker.claim("emails", limit=14):
        worker.acknowledge(lease.message_id, lease.token)
    for lease in worker.claim("sms", limit=3):
        worker.acknowledge(lease.message_id, lease.token)
    worker.persist_message("invoice-77", "billing", {"invoice": 77, "amount": "129.00"}, max_attempts=1)
    held = worker.claim_message("invoice-77")
    assert held
    worker.fail("invoice-77", held.token, "SMTPServerDisconnected('Connection unexpectedly closed')")
    crashed = ZeroLossMessageService(instance_id="worker-b:912 (crashed)")
    crashed.persist_messages(
        [("order-101-email", "emails", {"order": 101}), ("sms-101", "sms", {"to": "+1"})]
    )
    assert crashed.claim_message("order-101-email")
    assert crashed.claim_message("sms-101")
    live = ZeroLossMessageService(instance_id="worker-c:3301", ack_timeout=900)
    live.persist_message("report-2024-q4", "reports", {"report": "q4", "format": "pdf"})
    live_lease = live.claim_message("report-2024-q4")
    assert live_lease
    ZeroLossMessageService().register_replication_node("standby-1", "10.0.0.12", role="standby")
    assert expire_leases(["order-101-email", "sms-101"]) == 2  # the crashed worker's: two stuck messages
    assert set(Message.objects.stuck().values_list("message_id", flat=True)) == {"order-101-email", "sms-101"}
    return {"live": live, "live_lease": live_lease}


def login(page: Any, base: str) -> None:
    page.goto(f"{base}/admin/login/?next=/admin/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", "correct horse battery staple")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")


def run_action(page: Any, action: str) -> None:
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")


@pytest.mark.django_db(transaction=True)
def test_operator_desk_in_a_real_browser(live_server: Any, browser_page: Any, tmp_path: Path) -> None:
    page = browser_page
    base = live_server.url
    shots = Shots(tmp_path)
    ledger = make_ledger()
    user = User.objects.create_user("operator", password="correct horse battery staple", is_staff=True)
    for codename in OPERATOR_PERMS:
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="zeroloss", codename=codename)
        )

    login(page, base)
    # The admin index links the operator's desk.
    assert page.locator("#zl-desk-link a", has_text="Dashboard").is_visible()

    # Filter stuck messages.
    page.goto(f"{base}/admin/zeroloss/message/")
    page.click("#changelist-filter >> text=Expired (stuck)")
    page.wait_for_url("**lease=stuck**")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 2
    assert page.locator("#result_list .zl-badge.zl-expired", has_text="stuck").count() == 2
    assert "expired (stuck)" in (
        page.locator("#result_list .field-lease_display [title]").first.get_attribute("title") or ""
    )
    assert page.locator("#result_list", has_text="worker-b:912 (crashed)").count() == 1
    page.goto(f"{base}/admin/zeroloss/message/")
    shots.take(page, "admin-changelist.png", full_page=False)

    # Requeue them; the sweep would have done the same, exactly once.
    page.goto(f"{base}/admin/zeroloss/message/?lease=stuck")
    page.check("#action-toggle")
    run_action(page, "requeue_stuck")
    assert page.locator("ul.messagelist li.success").inner_text() == "2 stuck messages were requeued."
    assert set(
        Message.objects.filter(message_id__in=["order-101-email", "sms-101"]).values_list("status", flat=True)
    ) == {Status.PENDING}
    assert not Message.objects.stuck().exists()

    # The new audit row, with the operator's name, on the detail page.
    pk = Message.objects.get(message_id="order-101-email").pk
    page.goto(f"{base}/admin/zeroloss/message/{pk}/change/")
    last_row = page.locator("table.zl-audit tbody tr").last
    assert "requeued_by_operator" in last_row.inner_text()
    assert "operator" in last_row.inner_text()
    assert page.locator(".field-integrity", has_text="valid").count() == 1
    event = MessageEvent.objects.for_message("order-101-email").last()
    assert event is not None
    assert (event.reason, event.actor) == ("requeued_by_operator", "operator")

    # Redrive the dead letter.
    page.goto(f"{base}/admin/zeroloss/message/?status__exact=dead")
    assert page.locator("#result_list tbody tr").count() == 1
    page.check("#result_list tbody input.action-select")
    run_action(page, "redrive")
    assert "1 dead letter was redriven to pending" in page.locator("ul.messagelist").inner_text()
    invoice = Message.objects.get(message_id="invoice-77")
    assert (invoice.status, invoice.attempts) == (Status.PENDING, 0)

    # Force-requeue a live lease: only after the confirmation page.
    pk = Message.objects.get(message_id="report-2024-q4").pk
    page.goto(f"{base}/admin/zeroloss/message/{pk}/change/")
    shots.take(page, "admin-detail.png")
    page.click("button[value=force_requeue]")
    # is_visible() does not wait: wait for the confirmation page before asserting on it.
    page.wait_for_selector(".zl-warning >> text=The running worker will lose its lease.")
    assert "acknowledgement will be refused" in page.locator(".zl-warning").inner_text()
    assert Message.objects.get(message_id="report-2024-q4").status == Status.PROCESSING
    page.click("input[type=submit][value='Yes, revoke the leases and requeue']")
    page.wait_for_selector("ul.messagelist li.success")
    assert "1 message was requeued; its lease was revoked." in page.locator("ul.messagelist").inner_text()
    assert ledger["live"].acknowledge("report-2024-q4", ledger["live_lease"].token) is False

    # The dashboard.
    page.goto(f"{base}/admin/zeroloss/message/")
    page.click("a.zl-dashboard-link")
    page.wait_for_url("**/dashboard/")
    assert page.locator("#zl-throughput rect.zl-bar").count() == 60
    assert page.locator("#zl-stuck .zl-card-value").inner_text() == "0"
    assert page.locator("#zl-dead .zl-card-value").inner_text() == "0"
    assert page.locator("#zl-matrix tbody tr").count() == 4
    assert page.locator("#zl-nodes", has_text="standby-1").count() == 1
    assert page.locator("meta[http-equiv=refresh]").count() == 1
    shots.take(page, "dashboard.png")
    assert len(shots.taken) == 3


def long_traceback(n: int) -> str:
    frames = "".join(
        f'  File "/srv/app/venv/lib/python3.12/site-packages/smtp_client/transport/connection_{k}.py", '
        f"line {100 + k}, in send_with_retries_and_backoff\n    self._socket.sendall(payload)\n"
        for k in range(8)
    )
    return (
        f"Traceback (most recent call last):\n{frames}"
        f"SMTPServerDisconnected: Connection unexpectedly closed while sending message {n} to "
        "mx.example.com:25 after 3 retries; token=" + "x" * 300
    )


ROW_HEIGHTS_JS = """
() => Array.from(document.querySelectorAll('#result_list tbody tr')).map(tr => ({
    id: tr.querySelector('th, td.field-message_id, td:nth-child(2)').innerText.trim(),
    height: tr.getBoundingClientRect().height,
}))
"""

OVERFLOW_JS = """
(selector) => {
    const el = document.querySelector(selector);
    return {scroll: el.scrollWidth, client: el.clientWidth,
            page: document.documentElement.scrollWidth, viewport: document.documentElement.clientWidth};
}
"""


@pytest.mark.django_db(transaction=True)
def test_long_errors_stay_on_one_line_and_inside_the_page(
    live_server: Any, browser_page: Any, tmp_path: Path
) -> None:
    page = browser_page
    page.set_viewport_size({"width": 1400, "height": 900})
    base = live_server.url
    worker = ZeroLossMessageService(instance_id="worker-d:5150 (smtp relay, eu-west-1, pool 3)")
    for n in range(30):
        mid = f"invoice-2025-{n:04d}-reminder-email-for-customer-account-{n * 7919:08d}"
        worker.persist_message(mid, "billing", {"n": n}, max_attempts=1)
        lease = worker.claim_message(mid)
        assert lease
        assert worker.fail(mid, lease.token, long_traceback(n))
    worker.persist_message("p-1", "emails", {"n": 1})  # a row whose cells are all short: one line
    User.objects.create_superuser("operator", "op@example.com", "correct horse battery staple")
    login(page, base)

    page.goto(f"{base}/admin/zeroloss/message/")
    rows = page.evaluate(ROW_HEIGHTS_JS)
    assert len(rows) == 31
    one_line = next(r["height"] for r in rows if r["id"] == "p-1")
    tall = [r for r in rows if r["height"] > 2 * one_line]
    assert not tall, f"one-line row {one_line}px; taller than twice that: {tall[:3]}"
    # The full text is one hover away, and the cells say so.
    error = long_traceback(29)
    title = (
        page.locator("#result_list tbody tr")
        .nth(1)
        .locator(".field-short_error [title]")
        .get_attribute("title")
    )
    assert title == error
    full_id = page.locator("#result_list tbody tr").nth(1).locator("[title]").first.get_attribute("title")
    assert full_id is not None and full_id.startswith("invoice-2025-0029-reminder-email")
    box = page.evaluate(OVERFLOW_JS, "#content")
    assert box["page"] <= box["viewport"], box
    shots = Shots(tmp_path)
    shots.take(page, "admin-changelist-errors.png", full_page=False)

    pk = Message.objects.get(message_id="invoice-2025-0029-reminder-email-for-customer-account-00229651").pk
    page.goto(f"{base}/admin/zeroloss/message/{pk}/change/")
    audit = page.locator("table.zl-audit")
    assert "SMTPServerDisconnected" in audit.inner_text()  # the full detail is on the page, wrapped
    assert "x" * 300 in audit.inner_text().replace("\n", "")
    for selector in ("#content", "#content-main", "fieldset.module:has(table.zl-audit)"):
        box = page.evaluate(OVERFLOW_JS, selector)
        assert box["scroll"] <= box["client"], (selector, box)
    assert box["page"] <= box["viewport"], box
    shots.take(page, "admin-detail-traceback.png")
    table = audit.bounding_box()
    content = page.locator("#content-main").bounding_box()
    assert table is not None and content is not None
    assert table["x"] + table["width"] <= content["x"] + content["width"] + 1


#: Per row of the changelist: each named column's cell, its visible width, whether its text is cut.
CELLS_JS = """
(names) => Array.from(document.querySelectorAll('#result_list tbody tr')).map(tr => {
    const row = {};
    for (const name of names) {
        const cell = tr.querySelector('.field-' + name);
        if (!cell) { row[name] = null; continue; }
        const box = cell.getBoundingClientRect();
        row[name] = {width: box.width, right: box.right, cut: cell.scrollWidth > cell.clientWidth + 1,
                     text: cell.innerText.trim(), visible: box.width > 0 && getComputedStyle(cell).display !== 'none'};
    }
    return row;
})
"""

#: The columns an operator must read in full at 1360 x 900 (the last error: its start).
READABLE = ("id_column", "queue_column", "status_badge", "attempts_display", "age")


def make_busy_ledger() -> None:
    """Messages like a real project's: uuid ids, realistic queue names, errors, dead letters."""
    worker = ZeroLossMessageService(instance_id="web-7f9c4d8b5-x2kqz:4711/t3")
    for n in range(12):
        mid = f"{n:02d}3f9a1c5e0b4d7a8c2e6f1b9d0a7c3e5"  # uuid hex: two differ at their start
        queue = ("payments.refunds", "notifications.email", "billing.invoices")[n % 3]
        worker.persist_message(mid, queue, {"n": n}, max_attempts=3)
        lease = worker.claim_message(mid)
        assert lease
        assert worker.fail(
            mid, lease.token, f"ConnectionError: payment gateway timed out after 30 s (try {n})"
        )
    for n in range(2):  # processing and completed: the widest status badges
        mid = f"refund-{n}"
        worker.persist_message(mid, "payments.refunds", {"n": n})
        lease = worker.claim_message(mid)
        assert lease
        if n:
            assert worker.acknowledge(mid, lease.token)
    for n in range(6):
        mid = f"order-2025-{n:06d}-confirmation-email-to-customer-{n * 7919:08d}"  # differ in the middle
        worker.persist_message(mid, "notifications.email", {"n": n}, max_attempts=1)
        lease = worker.claim_message(mid)
        assert lease
        # Dead letters; an error as zeroloss records it: "module.Class: message", then the traceback.
        error = f"smtplib.SMTPServerDisconnected: Connection unexpectedly closed ({n})\n{long_traceback(n)}"
        assert worker.fail(mid, lease.token, error)


@pytest.mark.django_db(transaction=True)
def test_the_message_list_is_readable_at_1360_with_the_nav_sidebar_open(
    live_server: Any, browser_page: Any, tmp_path: Path
) -> None:
    page = browser_page
    assert page.viewport_size == {"width": 1360, "height": 900}
    base = live_server.url
    make_busy_ledger()
    User.objects.create_superuser("operator", "op@example.com", "correct horse battery staple")
    login(page, base)
    shots = Shots(tmp_path)
    for query, rows_expected in (("", 20), ("?status__exact=dead", 6)):
        page.goto(f"{base}/admin/zeroloss/message/{query}")
        sidebar = page.locator("#nav-sidebar")
        assert sidebar.is_visible() and (sidebar.bounding_box() or {"width": 0})["width"] > 200
        box = page.evaluate(OVERFLOW_JS, "#content")
        assert box["page"] <= box["viewport"], ("horizontal scrolling", query, box)
        table = page.evaluate(OVERFLOW_JS, "#result_list")
        assert table["scroll"] <= table["client"] + 1, ("the table overflows", query, table)
        rows = page.evaluate(CELLS_JS, [*READABLE, "short_error"])
        assert len(rows) == rows_expected, query
        ids = [row["id_column"]["text"] for row in rows]
        assert len(set(ids)) == len(ids), ("two ids look the same", ids)
        for row in rows:
            for name in READABLE:
                cell = row[name]
                assert cell is not None and cell["visible"] and not cell["cut"], (query, name, cell)
            error = row["short_error"]
            # about twenty characters of the error's start (Django 6.0's admin: 142 px at this width)
            assert error["visible"] and error["width"] >= 120, (query, "last error", error)
            assert error["right"] <= 1360, (query, "last error", error)
    shots.take(page, "admin-changelist-dead-letters.png", full_page=False)


@pytest.mark.django_db(transaction=True)
def test_queues_page_in_a_real_browser(live_server: Any, browser_page: Any, tmp_path: Path) -> None:
    """The dashboard links the Queues page; a queue that was never paused (no control row) is
    paused from it after the confirmation page, as the operator."""
    page = browser_page
    base = live_server.url
    shots = Shots(tmp_path)
    make_ledger()
    service = ZeroLossMessageService()
    service.pause_queue("sms", actor="ops-lead")
    service.limit_queue("emails", concurrency=4, rate="10/s", actor="ops-lead")
    user = User.objects.create_user("operator", password="correct horse battery staple", is_staff=True)
    for codename in (*OPERATOR_PERMS, "view_queuecontrol", "change_queuecontrol"):
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label="zeroloss", codename=codename)
        )
    assert not QueueControl.objects.filter(queue_name="reports").exists()

    login(page, base)
    page.goto(f"{base}/admin/zeroloss/message/dashboard/")
    page.click("#zl-queues-link a")
    page.wait_for_url("**/queuecontrol/queues/")
    table = page.locator("#zl-queues")
    assert table.locator("tr[data-queue=sms] .zl-state-paused").is_visible()
    assert table.locator("tr[data-queue=emails] .zl-state-running").is_visible()
    assert "concurrency 4" in table.locator("tr[data-queue=emails]").inner_text()
    assert "rate 10/s" in table.locator("tr[data-queue=emails]").inner_text()
    shots.take(page, "admin-queues.png")

    table.locator("tr[data-queue=reports] button[value=pause]").click()
    page.wait_for_selector(".zl-warning >> text=No worker will claim this queue's messages any more")
    assert not QueueControl.objects.filter(queue_name="reports").exists()  # asked, not done
    page.click("input[type=submit][value='Yes, pause it']")
    page.wait_for_selector("ul.messagelist li.success")
    assert "Paused queue reports" in page.locator("ul.messagelist").inner_text()
    assert page.locator("#zl-queues tr[data-queue=reports] .zl-state-paused").is_visible()
    control = QueueControl.objects.get(queue_name="reports")
    assert (control.paused, control.changed_by) == (True, "operator")
