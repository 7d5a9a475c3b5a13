"""The operator's desk: see, requeue, redrive, dead-letter and purge messages, safely.

The admin never writes a ``Message`` or ``MessageEvent`` row itself: every change is an
action that calls :class:`~zeroloss.service.ZeroLossMessageService`, which writes the
transition and its audit row (with the operator's user name as ``actor``) atomically.
Messages are never added or edited through a form.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import unquote
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from . import dashboard, replication
from .exceptions import MessageNotFound
from .models import Message, MessageEvent, PurgeRecord, ReplicationNode, Status
from .service import ZeroLossMessageService

#: Custom permissions (``Message.Meta.permissions``), by the action name that needs them.
PERMISSIONS = {
    "requeue": "zeroloss.requeue_message",
    "force_requeue": "zeroloss.force_requeue_message",
    "redrive": "zeroloss.redrive_message",
    "deadletter": "zeroloss.deadletter_message",
    "purge": "zeroloss.purge_message",
}
#: Above this many rows an unfiltered changelist shows PostgreSQL's estimate, not COUNT(*).
ESTIMATE_ABOVE = 100_000
#: Filtered changelists count at most this many rows ("10 000+" pages beyond are not offered).
COUNT_CAP = 10_000


def get_service() -> ZeroLossMessageService:
    """The service the admin acts through (a fresh, cheap instance per request)."""
    return ZeroLossMessageService(instance_id="admin")


def _actor(request: HttpRequest) -> str:
    return request.user.get_username()


# -- fast counting --------------------------------------------------------------------


class LedgerPaginator(Paginator):
    """A paginator that never runs an unbounded ``COUNT(*)`` over a large ledger.

    Unfiltered on PostgreSQL it uses the planner's estimate (``pg_class.reltuples``) once
    the table is large; otherwise it counts at most :data:`COUNT_CAP` rows.
    """

    estimated = False
    capped = False

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return len(qs)
        connection = connections[qs.db]
        if not qs.query.where and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
                    [qs.model._meta.db_table],
                )
                row = cursor.fetchone()
            estimate = int(row[0]) if row and row[0] is not None else -1
            if estimate >= ESTIMATE_ABOVE:
                self.estimated = True
                return estimate
        counted = int(qs.order_by()[: COUNT_CAP + 1].count())
        if counted > COUNT_CAP:
            self.capped = True
            return COUNT_CAP
        return counted


# -- filters --------------------------------------------------------------------------


class LeaseStateFilter(admin.SimpleListFilter):
    title = _("lease")
    parameter_name = "lease"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("stuck", str(_("Expired (stuck)"))),
            ("live", str(_("Live"))),
            ("none", str(_("No lease"))),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == "stuck":
            return queryset.filter(status=Status.PROCESSING, lease_expires_at__lt=Now())
        if value == "live":
            return queryset.filter(status=Status.PROCESSING, lease_expires_at__gte=Now())
        if value == "none":
            return queryset.filter(lease_expires_at__isnull=True)
        return queryset


class QueueFilter(admin.SimpleListFilter):
    title = _("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        service = get_service()
        key = "zeroloss:admin:queues"
        names: list[str] | None = cache.get(key) if service.settings.CACHE_TIMEOUT else None
        if names is None:
            names = list(
                Message.objects.order_by("queue_name").values_list("queue_name", flat=True).distinct()[:500]
            )
            if service.settings.CACHE_TIMEOUT:
                cache.set(key, names, service.settings.CACHE_TIMEOUT)
        return [(n, n) for n in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        return queryset.filter(queue_name=value) if value else queryset


# -- forms and intermediate pages -----------------------------------------------------


class DeadLetterForm(forms.Form):
    reason = forms.CharField(
        label=_("Reason"),
        max_length=1000,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=_("Recorded as the message's last error and in the audit trail."),
    )


def _selected_ids(queryset: QuerySet[Message]) -> list[str]:
    return list(queryset.order_by("id").values_list("message_id", flat=True))


def _lease_info(message: Message, now: dt.datetime) -> tuple[str, float | None]:
    """``("live" | "expired" | "none", seconds left (negative: overdue))``."""
    if message.status != Status.PROCESSING or message.lease_expires_at is None:
        return "none", None
    left = (message.lease_expires_at - now).total_seconds()
    return ("live" if left >= 0 else "expired"), left


# -- messages -------------------------------------------------------------------------


class ReadOnlyAdmin(admin.ModelAdmin):
    """The ledger is never edited through a form: every change is a service action."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = (
        "message_id",
        "queue_name",
        "status_badge",
        "attempts_display",
        "lease_display",
        "claimed_by",
        "age",
        "short_error",
    )
    list_display_links = ("message_id",)
    list_filter = ("status", QueueFilter, LeaseStateFilter, ("created_at", admin.DateFieldListFilter))
    search_fields = ("=message_id", "=queue_name", "last_error")
    search_help_text = _("Exact message id or queue name, or any part of the last error.")
    ordering = ("-id",)
    list_per_page = 50
    list_max_show_all = 500
    show_full_result_count = False
    paginator = LedgerPaginator
    actions = ["requeue_stuck", "force_requeue", "redrive", "dead_letter", "purge_completed"]
    actions_selection_counter = True
    change_list_template = "zeroloss/admin/message_change_list.html"
    change_form_template = "zeroloss/admin/message_change_form.html"
    fieldsets = (
        (
            None,
            {"fields": ("message_id", "queue_name", "status_badge", "attempts_display", "last_error_full")},
        ),
        (_("Payload"), {"fields": ("payload_pretty", "checksum", "integrity")}),
        (
            _("Lease"),
            {"fields": ("lease_display", "lease_token", "claimed_by", "available_at", "dispatched_at")},
        ),
        (_("Timeline"), {"fields": ("created_at", "updated_at", "completed_at", "dead_at", "commit_lsn")}),
        (_("Audit trail"), {"fields": ("audit_trail",)}),
    )
    readonly_fields = (
        "message_id",
        "queue_name",
        "status_badge",
        "attempts_display",
        "last_error_full",
        "payload_pretty",
        "checksum",
        "integrity",
        "lease_display",
        "lease_token",
        "claimed_by",
        "available_at",
        "dispatched_at",
        "created_at",
        "updated_at",
        "completed_at",
        "dead_at",
        "commit_lsn",
        "audit_trail",
    )

    # -- permissions: view for operators, no add / change / delete through forms --------

    def _has(self, request: HttpRequest, action: str) -> bool:
        return bool(request.user.has_perm(PERMISSIONS[action]))

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "requeue")

    def has_force_requeue_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "force_requeue")

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "redrive")

    def has_deadletter_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "deadletter")

    def has_purge_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "purge")

    def has_view_permission(self, request: HttpRequest, obj: Message | None = None) -> bool:
        # An operator allowed any action may see what it acts on.
        return super().has_view_permission(request, obj) or any(
            request.user.has_perm(p) for p in PERMISSIONS.values()
        )

    # -- queryset -------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Message]:
        # The database clock decides leases; one NOW() per row costs nothing.
        qs = super().get_queryset(request).annotate(db_now=Now())
        match = request.resolver_match
        if match is not None and (match.url_name or "").endswith("_changelist"):
            qs = qs.defer("payload", "replication_targets")
        return qs

    # -- columns --------------------------------------------------------------------------

    @staticmethod
    def _now(obj: Message) -> dt.datetime:
        now = getattr(obj, "db_now", None)
        if now is None:
            now = get_service().database_now()
        if now.tzinfo is None:
            now = now.replace(tzinfo=dt.UTC)
        return now

    @admin.display(description=_("status"), ordering="status")
    def status_badge(self, obj: Message) -> SafeString:
        return format_html('<span class="zl-badge zl-{}">{}</span>', obj.status, obj.get_status_display())

    @admin.display(description=_("attempts"))
    def attempts_display(self, obj: Message) -> str:
        return f"{obj.attempts} / {obj.max_attempts}"

    @admin.display(description=_("lease"), ordering="lease_expires_at")
    def lease_display(self, obj: Message) -> SafeString | str:
        state, left = _lease_info(obj, self._now(obj))
        if state == "live" and left is not None:
            return format_html(
                '<span class="zl-badge zl-live">live</span> {} left', dashboard.format_duration(left)
            )
        if state == "expired" and left is not None:
            return format_html(
                '<span class="zl-badge zl-expired">expired (stuck)</span> {} overdue',
                dashboard.format_duration(-left),
            )
        return "-"

    @admin.display(description=_("age"), ordering="created_at")
    def age(self, obj: Message) -> str:
        return dashboard.format_duration((self._now(obj) - obj.created_at).total_seconds())

    @admin.display(description=_("last error"))
    def short_error(self, obj: Message) -> str:
        return Truncator(obj.last_error).chars(80) if obj.last_error else ""

    @admin.display(description=_("last error"))
    def last_error_full(self, obj: Message) -> SafeString | str:
        return format_html('<pre class="zl-pre">{}</pre>', obj.last_error) if obj.last_error else "-"

    @admin.display(description=_("payload"))
    def payload_pretty(self, obj: Message) -> SafeString:
        text = json.dumps(obj.payload, indent=2, sort_keys=True, ensure_ascii=False)
        return format_html('<pre class="zl-pre zl-payload">{}</pre>', text)

    @admin.display(description=_("integrity"))
    def integrity(self, obj: Message) -> SafeString:
        report = get_service().verify_message_integrity(obj.message_id)
        rep = report.replication
        copies = (
            format_html(" &middot; {} of {} copies ({})", rep.confirmed, rep.required, rep.detail)
            if rep is not None
            else ""
        )
        if report.valid:
            return format_html('<span class="zl-badge zl-ok">valid</span>{}', copies)
        issues = format_html_join("", "<li>{}</li>", ((issue,) for issue in report.issues))
        return format_html(
            '<span class="zl-badge zl-bad">issues</span>{}<ul class="zl-issues">{}</ul>', copies, issues
        )

    @admin.display(description=_("audit trail"))
    def audit_trail(self, obj: Message) -> SafeString:
        events = get_service().get_events(obj.message_id)
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{} &rarr; {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
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
        return format_html(
            '<table class="zl-audit"><thead><tr><th>#</th><th>at (database clock)</th><th>transition</th>'
            "<th>reason</th><th>actor</th><th>attempt</th><th>detail</th></tr></thead><tbody>{}</tbody></table>",
            rows,
        )

    # -- actions --------------------------------------------------------------------------

    def _intermediate(
        self,
        request: HttpRequest,
        queryset: QuerySet[Message],
        *,
        action: str,
        title: Any,
        template: str,
        **context: Any,
    ) -> TemplateResponse:
        opts = self.model._meta
        ctx = {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": opts,
            "app_label": opts.app_label,
            "action_name": action,
            "queryset": queryset.order_by("id")[:200],
            "count": queryset.count(),
            "selected": [str(pk) for pk in queryset.values_list("pk", flat=True)],
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
            "select_across": request.POST.get("select_across", "0"),
            "database_now": get_service().database_now(),
            **context,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, template, ctx)

    def _run(
        self, request: HttpRequest, call: Callable[[list[str]], Sequence[str]], ids: list[str]
    ) -> list[str] | None:
        if not ids:
            self.message_user(
                request,
                _("None of the selected messages exists any more (purged meanwhile); nothing was changed."),
                messages.WARNING,
            )
            return None
        try:
            return list(call(ids))
        except MessageNotFound as exc:
            self.message_user(
                request,
                _("Message %(id)s no longer exists (purged meanwhile); nothing was changed.") % {"id": exc},
                messages.ERROR,
            )
            return None

    def _report_skipped(self, request: HttpRequest, selected: int, moved: int, why: str) -> None:
        skipped = selected - moved
        if skipped:
            self.message_user(
                request,
                ngettext(
                    "%(count)d selected message was left alone: %(why)s.",
                    "%(count)d selected messages were left alone: %(why)s.",
                    skipped,
                )
                % {"count": skipped, "why": why},
                messages.WARNING,
            )

    @admin.action(permissions=["requeue"], description=_("Requeue stuck messages (expired lease)"))
    def requeue_stuck(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        ids = _selected_ids(queryset)
        moved = self._run(request, lambda i: get_service().requeue_messages(i, actor=_actor(request)), ids)
        if moved is None:
            return
        if moved:
            self.message_user(
                request,
                ngettext(
                    "%(count)d stuck message was requeued.",
                    "%(count)d stuck messages were requeued.",
                    len(moved),
                )
                % {"count": len(moved)},
                messages.SUCCESS,
            )
        self._report_skipped(
            request,
            len(ids),
            len(moved),
            str(_("not stuck (no expired lease); use force-requeue for a live one")),
        )

    @admin.action(
        permissions=["force_requeue"], description=_("Force-requeue: revoke a live lease (asks to confirm)")
    )
    def force_requeue(self, request: HttpRequest, queryset: QuerySet[Message]) -> TemplateResponse | None:
        if request.POST.get("post") == "yes":
            ids = _selected_ids(queryset)
            moved = self._run(
                request,
                lambda i: get_service().requeue_messages(
                    i, actor=_actor(request), force=True, detail="live lease revoked by operator"
                ),
                ids,
            )
            if moved is None:
                return None
            self.message_user(
                request,
                ngettext(
                    "%(count)d message was requeued; its lease was revoked.",
                    "%(count)d messages were requeued; their leases were revoked.",
                    len(moved),
                )
                % {"count": len(moved)},
                messages.SUCCESS if moved else messages.WARNING,
            )
            self._report_skipped(request, len(ids), len(moved), str(_("not processing")))
            return None
        processing = queryset.filter(status=Status.PROCESSING)
        return self._intermediate(
            request,
            queryset,
            action="force_requeue",
            title=_("Revoke live leases and requeue?"),
            template="zeroloss/admin/force_requeue_confirmation.html",
            live=processing.filter(lease_expires_at__gte=Now()).order_by("id")[:200],
            live_count=processing.filter(lease_expires_at__gte=Now()).count(),
            processing_count=processing.count(),
        )

    @admin.action(permissions=["redrive"], description=_("Redrive dead letters back to pending"))
    def redrive(self, request: HttpRequest, queryset: QuerySet[Message]) -> None:
        ids = _selected_ids(queryset)
        moved = self._run(request, lambda i: get_service().redrive_messages(i, actor=_actor(request)), ids)
        if moved is None:
            return
        if moved:
            self.message_user(
                request,
                ngettext(
                    "%(count)d dead letter was redriven to pending (attempts reset).",
                    "%(count)d dead letters were redriven to pending (attempts reset).",
                    len(moved),
                )
                % {"count": len(moved)},
                messages.SUCCESS,
            )
        self._report_skipped(request, len(ids), len(moved), str(_("not dead")))

    @admin.action(permissions=["deadletter"], description=_("Dead-letter by hand (asks for a reason)"))
    def dead_letter(self, request: HttpRequest, queryset: QuerySet[Message]) -> TemplateResponse | None:
        form = DeadLetterForm(request.POST if request.POST.get("post") == "yes" else None)
        if form.is_valid():
            ids = _selected_ids(queryset)
            reason = form.cleaned_data["reason"]
            moved = self._run(
                request,
                lambda i: get_service().dead_letter_messages(i, reason=reason, actor=_actor(request)),
                ids,
            )
            if moved is None:
                return None
            if moved:
                self.message_user(
                    request,
                    ngettext(
                        "%(count)d message was dead-lettered.",
                        "%(count)d messages were dead-lettered.",
                        len(moved),
                    )
                    % {"count": len(moved)},
                    messages.SUCCESS,
                )
            self._report_skipped(request, len(ids), len(moved), str(_("already completed or dead")))
            return None
        return self._intermediate(
            request,
            queryset,
            action="dead_letter",
            title=_("Dead-letter messages by hand"),
            template="zeroloss/admin/dead_letter_form.html",
            form=form,
            live_count=queryset.filter(status=Status.PROCESSING, lease_expires_at__gte=Now()).count(),
        )

    @admin.action(
        permissions=["purge"],
        description=_("Purge completed messages older than the retention, in the selected queues"),
    )
    def purge_completed(self, request: HttpRequest, queryset: QuerySet[Message]) -> TemplateResponse | None:
        queues = sorted(set(queryset.values_list("queue_name", flat=True)))
        if request.POST.get("post") == "yes":
            self._purge(request, queues)
            return None
        return self._intermediate(
            request,
            queryset,
            action="purge_completed",
            title=_("Purge completed messages?"),
            template="zeroloss/admin/purge_confirmation.html",
            **self._purge_context(queues),
        )

    # -- purge (action and standalone page) ----------------------------------------------

    def _purge_context(self, queues: list[str] | None) -> dict[str, Any]:
        service = get_service()
        retention = service.settings.COMPLETED_RETENTION
        cutoff = service.database_now() - dt.timedelta(seconds=retention)
        eligible = Message.objects.filter(status=Status.COMPLETED, completed_at__lt=cutoff)
        if queues is not None:
            eligible = eligible.filter(queue_name__in=queues)
        return {
            "queues": queues,
            "retention": dashboard.format_duration(retention),
            "cutoff": cutoff,
            "eligible_count": eligible.order_by()[: COUNT_CAP + 1].count(),
            "count_cap": COUNT_CAP,
        }

    def _purge(self, request: HttpRequest, queues: list[str] | None) -> int:
        service = get_service()
        retention = service.settings.COMPLETED_RETENTION
        actor = _actor(request)
        if queues is None:
            purged = service.purge_messages(status=Status.COMPLETED, older_than=retention, actor=actor)
        else:
            purged = sum(
                service.purge_messages(
                    status=Status.COMPLETED, older_than=retention, queue_name=q, actor=actor
                )
                for q in queues
            )
        self.message_user(
            request,
            ngettext(
                "%(count)d completed message older than %(retention)s was purged.",
                "%(count)d completed messages older than %(retention)s were purged.",
                purged,
            )
            % {"count": purged, "retention": dashboard.format_duration(retention)},
            messages.SUCCESS,
        )
        return purged

    def purge_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_purge_permission(request):
            raise PermissionDenied
        changelist = reverse(f"{self.admin_site.name}:zeroloss_message_changelist")
        if request.method == "POST":
            self._purge(request, None)
            return HttpResponseRedirect(changelist)
        opts = self.model._meta
        context = {
            **self.admin_site.each_context(request),
            "title": _("Purge completed messages?"),
            "opts": opts,
            "app_label": opts.app_label,
            "standalone": True,
            "changelist_url": changelist,
            **self._purge_context(None),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "zeroloss/admin/purge_confirmation.html", context)

    # -- dashboard ------------------------------------------------------------------------

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        service = get_service()
        data = dashboard.snapshot(service, refresh=request.GET.get("refresh") == "1")
        opts = self.model._meta
        context = {
            **self.admin_site.each_context(request),
            "title": _("zeroloss dashboard"),
            "opts": opts,
            "app_label": opts.app_label,
            "data": data,
            "refresh_seconds": max(5, int(service.settings.CACHE_TIMEOUT or 5)),
            "changelist_url": reverse(f"{self.admin_site.name}:zeroloss_message_changelist"),
            "nodes_url": reverse(f"{self.admin_site.name}:zeroloss_replicationnode_changelist"),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "zeroloss/admin/dashboard.html", context)

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        custom = [
            path("dashboard/", wrap(self.dashboard_view), name="zeroloss_message_dashboard"),
            path("purge/", wrap(self.purge_view), name="zeroloss_message_purge"),
        ]
        return custom + super().get_urls()

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {"can_purge": self.has_purge_permission(request), **(extra_context or {})}
        return super().changelist_view(request, extra_context=context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        obj = self.get_object(request, unquote(object_id))
        relevant: set[str] = set()
        if obj is not None:
            lease, _left = _lease_info(obj, self._now(obj))
            applies = {
                "requeue_stuck": lease == "expired",
                "force_requeue": obj.status == Status.PROCESSING,
                "redrive": obj.status == Status.DEAD,
                "dead_letter": obj.status in (Status.PENDING, Status.PROCESSING),
            }
            relevant = {name for name, ok in applies.items() if ok}
        allowed = [
            # Django 6.1 returns Action objects (indexing them is deprecated); 5.2 returns tuples.
            (name, getattr(entry, "description", None) or entry[2])
            for name, entry in (self.get_actions(request) or {}).items()
            if entry is not None and name in relevant
        ]
        context = {"message_actions": allowed, **(extra_context or {})}
        return super().change_view(request, object_id, form_url, extra_context=context)


# -- replication nodes ----------------------------------------------------------------


@admin.register(ReplicationNode)
class ReplicationNodeAdmin(ReadOnlyAdmin):
    list_display = (
        "node_id",
        "liveness",
        "role",
        "address",
        "last_seen",
        "state",
        "sync_state",
        "flush_position",
        "replay_position",
    )
    list_filter = ("role",)
    search_fields = ("node_id", "address")
    ordering = ("node_id",)
    change_list_template = "zeroloss/admin/replicationnode_change_list.html"
    readonly_fields = (
        "node_id",
        "liveness",
        "role",
        "address",
        "last_seen",
        "last_seen_at",
        "registered_at",
        "state",
        "sync_state",
        "flush_position",
        "replay_position",
        "metadata_pretty",
    )
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[ReplicationNode]:
        return super().get_queryset(request).annotate(db_now=Now())

    @staticmethod
    def _age(obj: ReplicationNode) -> float:
        now = getattr(obj, "db_now", None) or get_service().database_now()
        if now.tzinfo is None:
            now = now.replace(tzinfo=dt.UTC)
        return (now - obj.last_seen_at).total_seconds()

    @admin.display(description=_("liveness"), ordering="last_seen_at")
    def liveness(self, obj: ReplicationNode) -> SafeString:
        if self._age(obj) <= get_service().settings.NODE_TTL:
            return format_html('<span class="zl-badge zl-live">{}</span>', _("live"))
        return format_html('<span class="zl-badge zl-bad">{}</span>', _("down"))

    @admin.display(description=_("last seen"), ordering="last_seen_at")
    def last_seen(self, obj: ReplicationNode) -> str:
        return f"{dashboard.format_duration(self._age(obj))} ago"

    @admin.display(description=_("flush position"))
    def flush_position(self, obj: ReplicationNode) -> str:
        return dashboard.format_lsn(obj.flush_lsn)

    @admin.display(description=_("replay position"))
    def replay_position(self, obj: ReplicationNode) -> str:
        return dashboard.format_lsn(obj.replay_lsn)

    @admin.display(description=_("metadata"))
    def metadata_pretty(self, obj: ReplicationNode) -> SafeString:
        return format_html('<pre class="zl-pre">{}</pre>', json.dumps(obj.metadata, indent=2, sort_keys=True))

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        service = get_service()
        context = {
            "requirement": replication.requirement(service),
            "replication": service.replication_status(),
            "node_ttl": dashboard.format_duration(service.settings.NODE_TTL),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=context)


# -- read-only ledger companions ------------------------------------------------------


@admin.register(MessageEvent)
class MessageEventAdmin(ReadOnlyAdmin):
    """The audit trail across messages: who did what, when. Append-only, so read-only here."""

    list_display = (
        "id",
        "created_at",
        "message_link",
        "from_status",
        "to_status",
        "reason",
        "actor",
        "attempt",
    )
    list_filter = ("reason", "to_status", ("created_at", admin.DateFieldListFilter))
    search_fields = ("=message__message_id", "=actor")
    search_help_text = _("Exact message id or actor.")
    ordering = ("-id",)
    list_select_related = ("message",)
    show_full_result_count = False
    paginator = LedgerPaginator
    readonly_fields = (
        "message_link",
        "from_status",
        "to_status",
        "reason",
        "actor",
        "attempt",
        "detail",
        "created_at",
    )
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[MessageEvent]:
        return super().get_queryset(request).defer("message__payload", "message__replication_targets")

    @admin.display(description=_("message"), ordering="message_id")
    def message_link(self, obj: MessageEvent) -> SafeString:
        url = reverse(f"{self.admin_site.name}:zeroloss_message_change", args=[obj.message_id])
        return format_html('<a href="{}">{}</a>', url, obj.message.message_id)


@admin.register(PurgeRecord)
class PurgeRecordAdmin(ReadOnlyAdmin):
    list_display = ("purged_at", "queue_name", "status", "count", "actor")
    list_filter = ("status", "queue_name")
    ordering = ("-purged_at",)
    readonly_fields = ("purged_at", "queue_name", "status", "count", "actor")
    fields = readonly_fields
