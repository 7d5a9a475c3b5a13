"""The message admin's own pages: the dashboard and *Purge completed…*."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .. import dashboard
from ..models import Message, Status
from ..service import ZeroLossMessageService
from . import paginator
from .base import MessagePermissions, actor, get_service


def cached_dashboard(service: ZeroLossMessageService, *, refresh: bool) -> dashboard.Dashboard:
    """The dashboard over the one cached snapshot (a dead cache is logged and bypassed there)."""
    return dashboard.snapshot(service, refresh=refresh)


class DeskViews(MessagePermissions):
    """Pages beside the changelist (mixed into :class:`~zeroloss.admin.MessageAdmin`)."""

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        custom = [
            path("dashboard/", wrap(self.dashboard_view), name="zeroloss_message_dashboard"),
            path("purge/", wrap(self.purge_view), name="zeroloss_message_purge"),
        ]
        return custom + super().get_urls()

    def _page_context(self, request: HttpRequest, title: Any) -> dict[str, Any]:
        opts = self.model._meta
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": opts,
            "app_label": opts.app_label,
            "changelist_url": reverse(f"{self.admin_site.name}:zeroloss_message_changelist"),
        }

    # -- dashboard ------------------------------------------------------------------------

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        service = get_service()
        data = cached_dashboard(service, refresh=request.GET.get("refresh") == "1")
        context = {
            **self._page_context(request, _("zeroloss dashboard")),
            "data": data,
            "refresh_seconds": max(5, int(service.settings.CACHE_TIMEOUT or 5)),
            "nodes_url": reverse(f"{self.admin_site.name}:zeroloss_replicationnode_changelist"),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "zeroloss/admin/dashboard.html", context)

    # -- purge (this page and the changelist action) --------------------------------------

    def purge_context(self, queues: list[str] | None) -> dict[str, Any]:
        """What the purge confirmation shows: retention, cutoff, how many (capped count)."""
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
            "eligible_count": eligible.order_by()[: paginator.COUNT_CAP + 1].count(),
            "count_cap": paginator.COUNT_CAP,
        }

    def purge_completed_messages(self, request: HttpRequest, queues: list[str] | None) -> int:
        """Purge completed messages older than the retention (in ``queues``, or all); says how many."""
        service = get_service()
        retention = service.settings.COMPLETED_RETENTION
        who = actor(request)
        if queues is None:
            purged = service.purge_messages(status=Status.COMPLETED, older_than=retention, actor=who)
        else:
            purged = sum(
                service.purge_messages(status=Status.COMPLETED, older_than=retention, queue_name=q, actor=who)
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
        context = self._page_context(request, _("Purge completed messages?"))
        if request.method == "POST":
            self.purge_completed_messages(request, None)
            return HttpResponseRedirect(context["changelist_url"])
        context = {**context, "standalone": True, **self.purge_context(None)}
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "zeroloss/admin/purge_confirmation.html", context)
