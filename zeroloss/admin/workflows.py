"""Workflows in the admin (docs/workflows.md): the list, a page per workflow, and its two actions.

The page shows the workflow's steps by level (:mod:`zeroloss.ops.workflows`, the report
``zeroloss_status --workflow`` prints too): status, attempts, result or last error, what each
waits for, and the dead steps that block it. Its actions, each asked on a confirmation page and
done on the confirming POST (``post=yes``), go through the ledger with the operator as the actor
of every audit row, like the message actions (:mod:`zeroloss.admin.actions`):

- **Redrive the dead steps** (``zeroloss.redrive_message``): back to pending, attempts reset; a
  redriven step that completes releases the steps it held.
- **Cancel the workflow** (``zeroloss.cancel_workflow``): :func:`zeroloss.cancel_workflow`,
  every step not yet finished cancelled, running ones aborted.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import Count, F, IntegerField, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from ..core.states import FINISHED_STATUSES, Status
from ..exceptions import WorkflowNotFound
from ..ledger.models import Message, Workflow
from ..ledger.types import CancelOutcome
from ..ops.workflows import WorkflowReport, workflow_report
from ..runtime.workflows import cancel_workflow
from .base import PERMISSIONS, ReadOnlyAdmin, actor, get_service

#: Cancelling a workflow needs this permission (``Workflow.Meta.permissions``).
CANCEL_PERMISSION = "zeroloss.cancel_workflow"


def _steps_with(status: Any) -> Coalesce:
    """How many steps of the row's workflow have one of these statuses (over the workflow-id index)."""
    statuses = [status] if isinstance(status, str) else list(status)
    counted = (
        Message.objects.filter(workflow_id=OuterRef("workflow_id"), status__in=statuses)
        .order_by()
        .values("workflow_id")
        .annotate(n=Count("*"))
        .values("n")
    )
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


class ProgressFilter(admin.SimpleListFilter):
    """Workflows by their steps' progress (counted per workflow over the workflow-id index)."""

    title = _("progress")
    parameter_name = "progress"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("dead_steps", str(_("With a dead step"))),
            ("unfinished", str(_("Not finished"))),
            ("finished", str(_("Finished"))),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == "dead_steps":
            return queryset.filter(dead__gt=0)
        if value == "unfinished":
            return queryset.filter(finished__lt=F("steps"))
        if value == "finished":
            return queryset.filter(finished__gte=F("steps"))
        return queryset


class WorkflowAdmin(ReadOnlyAdmin):
    list_display = ("workflow_id", "steps", "created_at", "progress")
    list_filter = (ProgressFilter, ("created_at", admin.DateFieldListFilter))
    search_fields = ("workflow_id",)
    search_help_text = _("The start of a workflow id.")
    ordering = ("-id",)
    list_per_page = 50
    show_full_result_count = False

    # -- permissions ----------------------------------------------------------------------

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # An operator who may see or act on messages may see the workflows they belong to.
        return (
            super().has_view_permission(request, obj)
            or request.user.has_perm("zeroloss.view_message")
            or any(request.user.has_perm(p) for p in (*PERMISSIONS.values(), CANCEL_PERMISSION))
        )

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(PERMISSIONS["redrive"]))

    def has_cancel_workflow_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm(CANCEL_PERMISSION))

    # -- the list -------------------------------------------------------------------------

    def get_queryset(self, request: HttpRequest) -> QuerySet[Workflow]:
        return (
            super()
            .get_queryset(request)
            .annotate(finished=_steps_with(FINISHED_STATUSES), dead=_steps_with(Status.DEAD.value))
        )

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Workflow], search_term: str
    ) -> tuple[QuerySet[Workflow], bool]:
        term = search_term.strip()
        if not term or "\x00" in term:
            return (queryset if not term else queryset.none()), False
        return queryset.filter(workflow_id__startswith=term), False

    @admin.display(description=_("progress"))
    def progress(self, obj: Workflow) -> SafeString:
        finished = getattr(obj, "finished", 0)
        dead = getattr(obj, "dead", 0)
        text = _("%(finished)s of %(steps)s finished") % {"finished": finished, "steps": obj.steps}
        if dead:
            return format_html(
                '{} <span class="zl-badge zl-dead">{}</span>',
                text,
                ngettext("%(n)d dead", "%(n)d dead", dead) % {"n": dead},
            )
        return format_html("{}", text)

    # -- the workflow's page --------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        custom = [
            path("<path:object_id>/redrive/", wrap(self.redrive_view), name="zeroloss_workflow_redrive"),
            path("<path:object_id>/cancel/", wrap(self.cancel_view), name="zeroloss_workflow_cancel"),
        ]
        return custom + super().get_urls()

    def _workflow(self, request: HttpRequest, object_id: str) -> Workflow:
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404(_("No workflow with the key %(key)r.") % {"key": object_id})
        if not self.has_view_permission(request, obj):
            raise PermissionDenied
        return obj

    def _context(self, request: HttpRequest, obj: Workflow, title: Any) -> dict[str, Any]:
        opts = self.model._meta
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": opts,
            "app_label": opts.app_label,
            "workflow": obj,
            "workflow_url": reverse(f"{self.admin_site.name}:zeroloss_workflow_change", args=[obj.pk]),
        }

    @staticmethod
    def _report(obj: Workflow) -> WorkflowReport | None:
        try:
            return workflow_report(get_service(), obj.workflow_id)
        except WorkflowNotFound:  # its steps were purged: the row alone is left
            return None

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        obj = self._workflow(request, object_id)
        report = self._report(obj)
        pks = dict(
            Message.objects.using(get_service().using)
            .filter(workflow_id=obj.workflow_id)
            .values_list("message_id", "pk")
        )
        change = f"{self.admin_site.name}:zeroloss_message_change"
        levels = [
            (
                level,
                [
                    (
                        line,
                        reverse(change, args=[pks[line.step.message_id]])
                        if line.step.message_id in pks
                        else "",
                    )
                    for line in lines
                ],
            )
            for level, lines in (report.levels() if report else [])
        ]
        context = {
            **self._context(request, obj, _("Workflow %(id)s") % {"id": obj.workflow_id}),
            "report": report,
            "levels": levels,
            "steps_url": reverse(f"{self.admin_site.name}:zeroloss_message_changelist")
            + "?"
            + urlencode({"q": f"workflow:{obj.workflow_id}"}),
            "can_redrive": bool(report and report.dead) and self.has_redrive_permission(request),
            "can_cancel": bool(report and report.live) and self.has_cancel_workflow_permission(request),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "zeroloss/admin/workflow.html", context)

    # -- the actions ----------------------------------------------------------------------

    def redrive_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Redrive the workflow's dead steps (those listed on the confirmation page)."""
        obj = self._workflow(request, object_id)
        if not self.has_redrive_permission(request):
            raise PermissionDenied(_("You may not redrive dead messages."))
        report = self._report(obj)
        dead = report.dead if report else []
        url = reverse(f"{self.admin_site.name}:zeroloss_workflow_change", args=[obj.pk])
        if request.method == "POST" and request.POST.get("post") == "yes":
            steps = request.POST.getlist("step")
            ours = {line.step.message_id for line in report.steps} if report else set()
            if not steps or not set(steps) <= ours:
                raise BadRequest("Name the dead steps of this workflow to redrive (step=<message id>).")
            moved = get_service().redrive_messages(steps, actor=actor(request))
            if moved:
                self.message_user(
                    request,
                    ngettext(
                        "%(count)d dead step was redriven to pending (attempts reset).",
                        "%(count)d dead steps were redriven to pending (attempts reset).",
                        len(moved),
                    )
                    % {"count": len(moved)},
                    messages.SUCCESS,
                )
            if len(moved) < len(steps):
                self.message_user(
                    request,
                    ngettext(
                        "%(count)d step was left alone: it is not dead any more.",
                        "%(count)d steps were left alone: they are not dead any more.",
                        len(steps) - len(moved),
                    )
                    % {"count": len(steps) - len(moved)},
                    messages.WARNING,
                )
            return HttpResponseRedirect(url)
        if not dead:
            self.message_user(request, _("This workflow has no dead step to redrive."), messages.WARNING)
            return HttpResponseRedirect(url)
        holds = {b.name: b.holds for b in report.blockers} if report else {}
        context = {
            **self._context(
                request, obj, _("Redrive the dead steps of workflow %(id)s?") % {"id": obj.workflow_id}
            ),
            "action": "redrive",
            "action_url": reverse(f"{self.admin_site.name}:zeroloss_workflow_redrive", args=[obj.pk]),
            "dead": [(line, holds.get(line.name, ())) for line in dead],
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "zeroloss/admin/workflow_confirmation.html", context)

    def cancel_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Cancel every step not yet finished (:func:`zeroloss.cancel_workflow`)."""
        obj = self._workflow(request, object_id)
        if not self.has_cancel_workflow_permission(request):
            raise PermissionDenied(_("You may not cancel workflows."))
        url = reverse(f"{self.admin_site.name}:zeroloss_workflow_change", args=[obj.pk])
        if request.method == "POST" and request.POST.get("post") == "yes":
            service = get_service()
            results = cancel_workflow(obj.workflow_id, using=service.using, actor=actor(request))
            cancelled = sum(r.outcome == CancelOutcome.CANCELLED for r in results)
            aborting = sum(r.outcome == CancelOutcome.ABORT_REQUESTED for r in results)
            self.message_user(
                request,
                _(
                    "Workflow %(id)s: %(cancelled)s step(s) cancelled, %(aborting)s running step(s) asked "
                    "to stop (cancelled when their handlers end), %(left)s left as they were."
                )
                % {
                    "id": obj.workflow_id,
                    "cancelled": cancelled,
                    "aborting": aborting,
                    "left": len(results) - cancelled - aborting,
                },
                messages.SUCCESS if cancelled or aborting else messages.WARNING,
            )
            return HttpResponseRedirect(url)
        report = self._report(obj)
        live = report.live if report else []
        if not live:
            self.message_user(
                request, _("Every step of this workflow has finished: nothing to cancel."), messages.WARNING
            )
            return HttpResponseRedirect(url)
        context = {
            **self._context(request, obj, _("Cancel workflow %(id)s?") % {"id": obj.workflow_id}),
            "action": "cancel",
            "action_url": reverse(f"{self.admin_site.name}:zeroloss_workflow_cancel", args=[obj.pk]),
            "live": live,
            "running": sum(line.step.status == Status.PROCESSING for line in live),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "zeroloss/admin/workflow_confirmation.html", context)
