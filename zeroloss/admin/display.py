"""How a message looks in the admin: the changelist's columns and the detail page's fields.

Every value is escaped (``format_html``); every lease time is on the database clock.
"""

from __future__ import annotations

import datetime as dt
import json

from django.contrib import admin
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..ledger.models import Message, Status, Workflow
from ..ops import dashboard
from . import why
from .base import MessagePermissions, get_service


def lease_info(message: Message, now: dt.datetime) -> tuple[str, float | None]:
    """``("live" | "expired" | "none", seconds left (negative: overdue))``."""
    if message.status != Status.PROCESSING or message.lease_expires_at is None:
        return "none", None
    left = (message.lease_expires_at - now).total_seconds()
    return ("live" if left >= 0 else "expired"), left


#: A list cell shows at most this many characters (CSS cuts it to the column with an ellipsis).
CELL_CHARS = 200
#: A message id longer than this shows its start and its end, an ellipsis between (the title has it all).
ID_CHARS = 21
#: The hover text (``title``) of a list cell holds at most this many; the detail page has all.
TITLE_CHARS = 2000


def one_line(text: str, *, title: str | None = None) -> SafeString:
    """A list cell's value on one line: CSS ends it with an ellipsis, the full text is the title."""
    full = text if title is None else title
    if len(full) > TITLE_CHARS:
        full = full[:TITLE_CHARS] + "…"
    shown = text if len(text) <= CELL_CHARS else text[:CELL_CHARS] + "…"
    return format_html('<span class="zl-line" title="{}">{}</span>', full, shown)


def database_now(obj: Message) -> dt.datetime:
    """The database clock, as selected with the row (``db_now``), or read now."""
    now = getattr(obj, "db_now", None)
    if now is None:
        now = get_service().database_now()
    if now.tzinfo is None:
        now = now.replace(tzinfo=dt.UTC)
    return now


class MessageColumns(MessagePermissions):
    """The message admin's display methods (mixed into :class:`~zeroloss.admin.MessageAdmin`)."""

    # -- the changelist: one line per message (the ``zl-line`` cells, admin.css) -----------

    @admin.display(description=_("message id"), ordering="message_id")
    def id_column(self, obj: Message) -> SafeString:
        # Its start and its end: ids often share a long prefix (order-2025-…) or differ only there.
        mid = obj.message_id
        if len(mid) <= ID_CHARS:
            return one_line(mid)
        keep = ID_CHARS - 1
        return one_line(f"{mid[: keep - keep // 3]}…{mid[-(keep // 3) :]}", title=mid)

    @admin.display(description=_("queue"), ordering="queue_name")
    def queue_column(self, obj: Message) -> SafeString:
        return one_line(obj.queue_name)

    @admin.display(description=_("priority"), ordering="priority")
    def priority_column(self, obj: Message) -> int:
        return obj.priority

    @admin.display(description=_("ordering key"), ordering="ordering_key")
    def key_column(self, obj: Message) -> SafeString | str:
        if not obj.ordering_key:
            return "-"
        if obj.status == Status.PENDING and obj.available_at is None:
            # Not claimable until the messages before it in its key finish.
            return one_line(
                obj.ordering_key, title=_("%(key)s (waiting for its key)") % {"key": obj.ordering_key}
            )
        return one_line(obj.ordering_key)

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: Message) -> SafeString:
        return format_html('<span class="zl-badge zl-{}">{}</span>', obj.status, obj.get_status_display())

    @admin.display(description=_("attempts"))
    def attempts_display(self, obj: Message) -> str:
        return f"{obj.attempts} / {obj.max_attempts}"

    @admin.display(description=_("lease"), ordering="lease_expires_at")
    def lease_display(self, obj: Message) -> SafeString | str:
        state, left = lease_info(obj, database_now(obj))
        if left is None:
            return "-"
        if state == "live":
            badge, css, text = _("live"), "zl-live", _("%(duration)s left")
        else:
            badge, css, text = _("stuck"), "zl-expired", _("%(duration)s overdue")
        duration = dashboard.format_duration(abs(left))
        full = _("lease %(state)s, %(duration)s") % {
            "state": _("live") if state == "live" else _("expired (stuck)"),
            "duration": text % {"duration": duration},
        }
        # The list shows the badge and the duration; the words are in the title (hover).
        return format_html(
            '<span class="zl-line" title="{}"><span class="zl-badge {}">{}</span> {}</span>',
            full,
            css,
            badge,
            duration,
        )

    @admin.display(description=_("claimed by"), ordering="claimed_by")
    def claimed_by_column(self, obj: Message) -> SafeString | str:
        return one_line(obj.claimed_by) if obj.claimed_by else "-"

    @admin.display(description=_("age"), ordering="created_at")
    def age(self, obj: Message) -> str:
        return dashboard.format_duration((database_now(obj) - obj.created_at).total_seconds())

    @admin.display(description=_("last error"))
    def short_error(self, obj: Message) -> SafeString | str:
        return one_line(obj.last_error) if obj.last_error else ""

    # -- the detail page ------------------------------------------------------------------

    @admin.display(description=_("last error"))
    def last_error_full(self, obj: Message) -> SafeString | str:
        return format_html('<pre class="zl-pre">{}</pre>', obj.last_error) if obj.last_error else "-"

    @admin.display(description=_("workflow"))
    def workflow_link(self, obj: Message) -> SafeString | str:
        """A step's workflow: its page, and the step's name in it."""
        if not obj.workflow_id:
            return "-"
        text = _("%(workflow)s (step %(step)s)") % {"workflow": obj.workflow_id, "step": obj.step_name}
        pk = (
            Workflow.objects.using(obj._state.db)
            .filter(workflow_id=obj.workflow_id)
            .values_list("pk", flat=True)
            .first()
        )
        try:
            url = reverse(f"{self.admin_site.name}:zeroloss_workflow_change", args=[pk]) if pk else ""
        except NoReverseMatch:  # a site without the workflow admin
            url = ""
        return format_html('<a href="{}" id="zl-workflow-link">{}</a>', url, text) if url else text

    @admin.display(description=_("retry policy"))
    def policy_display(self, obj: Message) -> str:
        return why.policy_text(obj)

    @admin.display(description=_("why here"))
    def why_display(self, obj: Message) -> str:
        return why.why_text(obj, get_service().get_events(obj.message_id), database_now(obj))

    @admin.display(description=_("payload"))
    def payload_pretty(self, obj: Message) -> SafeString:
        text = json.dumps(obj.payload, indent=2, sort_keys=True, ensure_ascii=False)
        return format_html('<pre class="zl-pre zl-payload">{}</pre>', text)

    @admin.display(description=_("headers"))
    def headers_pretty(self, obj: Message) -> SafeString | str:
        if not obj.headers:
            return "-"
        text = json.dumps(obj.headers, indent=2, sort_keys=True, ensure_ascii=False)
        return format_html('<pre class="zl-pre zl-headers">{}</pre>', text)

    @admin.display(description=_("integrity"))
    def integrity(self, obj: Message) -> SafeString:
        # A GET never writes: the replication measurement is the read-only one (record=False
        # compares against the current WAL position instead of recording a commit position).
        service = get_service()
        report = service.verify_message(obj, database_now(obj), replication=False)
        rep = service.replication_status(obj, record=False)
        issues = list(report.issues)
        if not rep.sufficient:
            issues.append(
                _("Insufficient replication: %(confirmed)s/%(required)s (%(detail)s)")
                % {"confirmed": rep.confirmed, "required": rep.required, "detail": rep.detail}
            )
        copies = format_html(
            " &middot; {}",
            _("%(confirmed)s of %(required)s copies (%(detail)s)")
            % {"confirmed": rep.confirmed, "required": rep.required, "detail": rep.detail},
        )
        if not issues:
            return format_html('<span class="zl-badge zl-ok">{}</span>{}', _("valid"), copies)
        items = format_html_join("", "<li>{}</li>", ((issue,) for issue in issues))
        return format_html(
            '<span class="zl-badge zl-bad">{}</span>{}<ul class="zl-issues">{}</ul>',
            _("issues"),
            copies,
            items,
        )

    @admin.display(description=_("audit trail"))
    def audit_trail(self, obj: Message) -> SafeString:
        events = get_service().get_events(obj.message_id)
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{} &rarr; {}</td><td>{}</td><td>{}</td><td>{}</td>"
            '<td class="zl-detail">{}</td></tr>',
            (
                (
                    e.id,
                    e.created_at.isoformat(sep=" ", timespec="milliseconds"),
                    e.from_status or "-",
                    e.to_status,
                    e.reason,
                    e.actor,
                    e.attempt,
                    e.detail,
                )
                for e in events
            ),
        )
        # Fixed column widths (admin.css): the detail column takes the rest and wraps, so a
        # traceback stays inside the page instead of widening it.
        return format_html(
            '<table class="zl-audit"><colgroup><col class="zl-c-id"><col class="zl-c-at">'
            '<col class="zl-c-transition"><col class="zl-c-reason"><col class="zl-c-actor">'
            '<col class="zl-c-attempt"><col></colgroup>'
            "<thead><tr><th>#</th><th>{}</th><th>{}</th><th>{}</th>"
            "<th>{}</th><th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
            _("at (database clock)"),
            _("transition"),
            _("reason"),
            _("actor"),
            _("attempt"),
            _("detail"),
            rows,
        )
