"""Read-only admins of the ledger's companions: replication nodes, audit events, purge records."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..integrations import replication
from ..ledger.models import MessageEvent, ReplicationNode
from ..ops import dashboard
from . import search
from .base import ReadOnlyAdmin, get_service
from .filters import ReasonFilter, ToStatusFilter
from .paginator import LedgerPaginator


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
        return _("%(duration)s ago") % {"duration": dashboard.format_duration(self._age(obj))}

    @admin.display(description=_("flush position"))
    def flush_position(self, obj: ReplicationNode) -> str:
        return dashboard.format_lsn(obj.flush_lsn) or "-"

    @admin.display(description=_("replay position"))
    def replay_position(self, obj: ReplicationNode) -> str:
        return dashboard.format_lsn(obj.replay_lsn) or "-"

    @admin.display(description=_("metadata"))
    def metadata_pretty(self, obj: ReplicationNode) -> SafeString:
        return format_html('<pre class="zl-pre">{}</pre>', json.dumps(obj.metadata, indent=2, sort_keys=True))

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        service = get_service()
        context = {
            "requirement": replication.requirement(service),
            "replication": service.replication_status(record=False),
            "node_ttl": dashboard.format_duration(service.settings.NODE_TTL),
            **(extra_context or {}),
        }
        return super().changelist_view(request, extra_context=context)


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
    list_filter = (ReasonFilter, ToStatusFilter, ("created_at", admin.DateFieldListFilter))
    # Only shows the search box: get_search_results below decides what a term matches.
    search_fields = ("message__message_id",)
    search_help_text = _("Exact message id; actor:… for an exact actor (slower).")
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

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[MessageEvent], search_term: str
    ) -> tuple[QuerySet[MessageEvent], bool]:
        return search.search_events(queryset, search_term), False

    @admin.display(description=_("message"), ordering="message_id")
    def message_link(self, obj: MessageEvent) -> SafeString:
        url = reverse(f"{self.admin_site.name}:zeroloss_message_change", args=[obj.message_id])
        return format_html('<a href="{}">{}</a>', url, obj.message.message_id)


class PurgeRecordAdmin(ReadOnlyAdmin):
    list_display = ("purged_at", "queue_name", "status", "count", "actor")
    list_filter = ("status", "queue_name")
    ordering = ("-purged_at",)
    readonly_fields = ("purged_at", "queue_name", "status", "count", "actor")
    fields = readonly_fields
