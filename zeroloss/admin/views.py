"""The message admin's own pages: the dashboard, *Blocked keys* and *Purge completed…*."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import BadRequest, PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..exceptions import InvalidMessage
from ..ledger.models import Message, Status
from ..ledger.service import ZeroLossMessageService
from ..ledger.types import KeyWhy
from ..ops import dashboard
from . import paginator
from .base import MessagePermissions, actor, get_service

#: Blocked keys listed on the *Blocked keys* page (longest blocked first).
SHOWN_BLOCKED_KEYS = 200


def cached_dashboard(service: ZeroLossMessageService, *, refresh: bool) -> dashboard.Dashboard:
    """The dashboard over the one cached snapshot (a dead cache is logged and bypassed there)."""
    return dashboard.snapshot(service, refresh=refresh)


class DeskViews(MessagePermissions):
    """Pages beside the changelist (mixed into :class:`~zeroloss.admin.MessageAdmin`)."""

    #: The actions of the blocked-keys page by name (``MessageAdmin`` sets them).
    key_actions: ClassVar[dict[str, Any]] = {}

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        custom = [
            path("dashboard/", wrap(self.dashboard_view), name="zeroloss_message_dashboard"),
            path("purge/", wrap(self.purge_view), name="zeroloss_message_purge"),
            path("blocked-keys/", wrap(self.blocked_keys_view), name="zeroloss_message_blocked_keys"),
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

    # -- blocked ordering keys ------------------------------------------------------------

    def blocked_keys_view(self, request: HttpRequest) -> HttpResponse:
        """Keys whose head holds up the messages behind it; skip or requeue a head from here.

        ``?queue=`` narrows to one queue (an invalid name is 400). A POST runs one of
        :data:`~.actions.KEY_ACTIONS` on the head it names, exactly as the changelist would:
        same permissions (403 without), same confirmation page, same feedback.
        """
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self._key_action(request)
        queue = request.GET.get("queue") or None
        service = get_service()
        try:
            keys = service.blocked_keys(queue, limit=SHOWN_BLOCKED_KEYS + 1)
        except InvalidMessage as exc:
            raise BadRequest(str(exc)) from exc
        shown = keys[:SHOWN_BLOCKED_KEYS]
        pks = dict(
            Message.objects.using(service.using)
            .filter(message_id__in=[k.message_id for k in shown if k.message_id])
            .values_list("message_id", "pk")
        )
        changelist = reverse(f"{self.admin_site.name}:zeroloss_message_changelist")
        rows = [
            {
                "key": k,
                "pk": pks.get(k.message_id or ""),
                "since": dashboard.format_duration(k.blocked_for),
                "key_url": f"{changelist}?{urlencode({'queue': k.queue_name, 'q': 'key:' + k.ordering_key})}",
                "can_requeue": k.why == KeyWhy.LEASE_EXPIRED,
            }
            for k in shown
        ]
        context = {
            **self._page_context(request, _("Blocked ordering keys")),
            "rows": rows,
            "more": len(keys) > SHOWN_BLOCKED_KEYS,
            "shown_cap": SHOWN_BLOCKED_KEYS,
            "queue": queue,
            "database_now": service.database_now(),
            "can_skip": self.has_deadletter_permission(request),
            "can_requeue": self.has_requeue_permission(request),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "zeroloss/admin/blocked_keys.html", context)

    def _key_action(self, request: HttpRequest) -> HttpResponse:
        name = request.POST.get("action", "")
        action = self.key_actions.get(name)
        if action is None:
            raise BadRequest(f"There is no key action {name!r}.")
        needs = getattr(action, "allowed_permissions", ())
        if not all(getattr(self, f"has_{perm}_permission")(request) for perm in needs):
            raise PermissionDenied(f"You may not run the action {name!r}.")
        pks = request.POST.getlist(ACTION_CHECKBOX_NAME)
        if not pks or any(not pk.isdigit() for pk in pks):
            raise BadRequest("Selected messages must be given by their numeric ids.")
        queryset = self.get_queryset(request).filter(pk__in=pks)
        response = action(self, request, queryset)
        return response if response is not None else HttpResponseRedirect(request.get_full_path())

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
