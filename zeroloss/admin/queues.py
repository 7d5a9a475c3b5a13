"""Queue control in the admin: every queue's control row, and pause / resume actions (each
asks to confirm) through the service, with the operator as the actor (docs/control.md). The
*Queues* page (:mod:`.queue_page`) shows every queue, with or without a control row."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..ledger.models import QueueControl
from .base import ReadOnlyAdmin, actor, get_service
from .confirm import confirmed, selection_fields
from .queue_page import QueuePageViews

#: Pausing and resuming need the model's change permission (its rows are never edited by form).
CONTROL_PERMISSION = "zeroloss.change_queuecontrol"


def _confirm(
    modeladmin: QueueControlAdmin,
    request: HttpRequest,
    queryset: QuerySet[QueueControl],
    action: str,
    title: Any,
) -> TemplateResponse:
    opts = modeladmin.model._meta
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(
        request,
        "zeroloss/admin/queue_control_confirmation.html",
        {
            **modeladmin.admin_site.each_context(request),
            "title": title,
            "opts": opts,
            "app_label": opts.app_label,
            "action_name": action,
            "queryset": queryset.order_by("queue_name"),
            "count": queryset.count(),
            "selection_fields": selection_fields(request),
            "form_url": request.get_full_path(),
            "pausing": action == "pause",
        },
    )


def _set(
    modeladmin: QueueControlAdmin, request: HttpRequest, queryset: QuerySet[QueueControl], paused: bool
) -> None:
    service = get_service()
    names = list(queryset.values_list("queue_name", flat=True))
    for name in names:
        (service.pause_queue if paused else service.resume_queue)(name, actor=actor(request))
    text = (
        ngettext("Paused %(count)d queue: %(names)s.", "Paused %(count)d queues: %(names)s.", len(names))
        if paused
        else ngettext(
            "Resumed %(count)d queue: %(names)s.", "Resumed %(count)d queues: %(names)s.", len(names)
        )
    )
    modeladmin.message_user(
        request, text % {"count": len(names), "names": ", ".join(names)}, messages.SUCCESS
    )


@admin.register(QueueControl)
class QueueControlAdmin(QueuePageViews, ReadOnlyAdmin):
    list_display = ("queue_name", "state", "concurrency", "rate", "changed_by", "changed_at")
    list_filter = ("paused",)
    search_fields = ("queue_name",)
    ordering = ("queue_name",)
    actions = ["pause", "resume"]

    def has_control_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(CONTROL_PERMISSION))

    def get_urls(self) -> list[URLPattern]:
        return self.queue_page_urls() + super().get_urls()

    @admin.display(description=_("state"), ordering="paused")
    def state(self, obj: QueueControl) -> SafeString:
        """Paused or running, in words: a bare check mark would read as "all is well"."""
        if obj.paused:
            return format_html('<span class="zl-badge zl-bad zl-state-paused">{}</span>', _("Paused"))
        return format_html('<span class="zl-badge zl-ok zl-state-running">{}</span>', _("Running"))

    @admin.action(permissions=["control"], description=_("Pause selected queues (asks to confirm)"))
    def pause(self, request: HttpRequest, queryset: QuerySet[QueueControl]) -> TemplateResponse | None:
        if confirmed(request):
            _set(self, request, queryset, True)
            return None
        return _confirm(self, request, queryset, "pause", _("Pause these queues?"))

    @admin.action(permissions=["control"], description=_("Resume selected queues (asks to confirm)"))
    def resume(self, request: HttpRequest, queryset: QuerySet[QueueControl]) -> TemplateResponse | None:
        if confirmed(request):
            _set(self, request, queryset, False)
            return None
        return _confirm(self, request, queryset, "resume", _("Resume these queues?"))
