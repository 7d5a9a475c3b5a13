"""The messages' admin: a read-only changelist and detail page, and the operator's actions."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse
from django.utils.translation import gettext_lazy as _

from ..core.states import ACTIVE_STATUSES, Reason, sources_of
from ..ledger.models import Message, Status
from . import actions, search
from .display import MessageColumns, database_now, lease_info
from .filters import LeaseStateFilter, OrderingStateFilter, PriorityFilter, QueueFilter
from .paginator import LedgerPaginator
from .views import DeskViews


class MessageAdmin(MessageColumns, DeskViews):
    list_display = (
        "id_column",
        "queue_column",
        "key_column",
        "priority_column",
        "status_badge",
        "attempts_display",
        "lease_display",
        "claimed_by_column",
        "age",
        "short_error",
    )
    list_display_links = ("id_column",)
    list_filter = (
        "status",
        QueueFilter,
        LeaseStateFilter,
        OrderingStateFilter,
        PriorityFilter,
        ("created_at", admin.DateFieldListFilter),
    )
    # Only shows the search box: get_search_results below decides what a term matches.
    search_fields = ("message_id", "queue_name")
    search_help_text = _(
        "Exact message id or queue name (id:… for an id only); key:… an exact ordering key; "
        "workflow:… the steps of a workflow; error:… searches the last errors (slower)."
    )
    ordering = ("-id",)
    list_per_page = 50
    list_max_show_all = 500
    show_full_result_count = False
    paginator = LedgerPaginator
    key_actions = actions.KEY_ACTIONS
    actions = [
        actions.requeue_stuck,
        actions.force_requeue,
        actions.redrive,
        actions.dead_letter,
        actions.skip_key_head,
        actions.requeue_key_head,
        actions.purge_completed,
        actions.cancel,
        actions.abort,
    ]
    actions_selection_counter = True
    change_list_template = "zeroloss/admin/message_change_list.html"
    change_form_template = "zeroloss/admin/message_change_form.html"
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "message_id",
                    "queue_name",
                    "ordering_key",
                    "priority",
                    "status_badge",
                    "attempts_display",
                    "why_display",
                    "policy_display",
                    "last_error_full",
                )
            },
        ),
        (_("Payload"), {"fields": ("payload_pretty", "headers_pretty", "checksum", "integrity")}),
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
        "ordering_key",
        "priority",
        "status_badge",
        "attempts_display",
        "why_display",
        "policy_display",
        "last_error_full",
        "workflow_link",
        "payload_pretty",
        "headers_pretty",
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

    def get_queryset(self, request: HttpRequest) -> QuerySet[Message]:
        # The database clock decides leases; one NOW() per row costs nothing.
        qs = super().get_queryset(request).annotate(db_now=Now())
        match = request.resolver_match
        if match is not None and (match.url_name or "").endswith("_changelist"):
            qs = qs.defer("payload", "headers", "replication_targets")
        return qs

    def get_fieldsets(self, request: HttpRequest, obj: Message | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or not obj.workflow_id:
            return fieldsets
        # A workflow's step: its workflow, right under its id.
        (name, first), *rest = fieldsets
        fields = list(first["fields"])
        fields.insert(fields.index("message_id") + 1, "workflow_link")
        return [(name, {**first, "fields": fields}), *rest]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Message], search_term: str
    ) -> tuple[QuerySet[Message], bool]:
        return search.search_messages(queryset, search_term), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if request.method == "POST" and request.POST.get("action"):
            self._refuse_forged_action(request)
        context = {"can_purge": self.has_purge_permission(request), **(extra_context or {})}
        return super().changelist_view(request, extra_context=context)

    def _refuse_forged_action(self, request: HttpRequest) -> None:
        """A POSTed action this user may not run is 403, one that does not exist or a selection
        that is not message ids is 400 (Django would quietly answer "No action selected")."""
        name = request.POST["action"]
        if name not in self.get_actions(request):
            known = {getattr(func, "__name__", "") for func in self.actions or ()}
            if name in known:
                raise PermissionDenied(f"You may not run the action {name!r}.")
            raise BadRequest(f"There is no action {name!r}.")
        if any(not pk.isdigit() for pk in request.POST.getlist("_selected_action")):
            raise BadRequest("Selected messages must be given by their numeric ids.")

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
            lease, _left = lease_info(obj, database_now(obj))
            applies = {
                "requeue_stuck": lease == "expired",
                "force_requeue": obj.status == Status.PROCESSING,
                "redrive": obj.status == Status.DEAD,
                "dead_letter": obj.status in sources_of(Reason.DEAD_LETTERED_BY_OPERATOR),
                "skip_key_head": bool(obj.ordering_key)
                and obj.status in ACTIVE_STATUSES
                and obj.available_at is not None,
                "requeue_key_head": bool(obj.ordering_key) and lease == "expired",
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
