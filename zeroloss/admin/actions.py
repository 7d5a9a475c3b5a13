"""The operator's actions on selected messages, in the shape of ``django.contrib.admin.actions``.

Each action is a function ``(modeladmin, request, queryset)`` decorated with
``@admin.action(permissions=[...], description=...)``: Django offers it only to operators who
hold the permission, and checks it again on POST. Destructive actions first answer with a
confirmation page and act on the confirming POST (``post=yes``). Every change goes through
:class:`~zeroloss.service.ZeroLossMessageService`, which writes the transition and its audit
row (``actor`` = the operator) atomically; feedback is pluralised with ``ngettext``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext, ngettext_lazy

from ..exceptions import MessageNotFound
from ..models import Message, Status
from ..service import ZeroLossMessageService
from .base import ReadOnlyAdmin, actor, get_service
from .views import DeskViews

#: Messages listed by name on a confirmation page (the count covers all of them).
SHOWN_ON_CONFIRMATION = 200


@dataclass(frozen=True)
class Transition:
    """One operator transition: the service call that moves messages, and what to say after.

    ``move(service, message_ids, actor)`` returns the ids it moved. ``done`` is an
    ``ngettext_lazy`` message with a ``%(count)d``; ``left_alone`` says why the rest stayed.
    """

    move: Callable[[ZeroLossMessageService, list[str], str], Sequence[str]]
    done: Any
    left_alone: Any


REQUEUE_STUCK = Transition(
    move=lambda service, ids, who: service.requeue_messages(ids, actor=who),
    done=ngettext_lazy(
        "%(count)d stuck message was requeued.", "%(count)d stuck messages were requeued.", "count"
    ),
    left_alone=_("not stuck (no expired lease); use force-requeue for a live one"),
)
FORCE_REQUEUE = Transition(
    move=lambda service, ids, who: service.requeue_messages(
        ids, actor=who, force=True, detail="live lease revoked by operator"
    ),
    done=ngettext_lazy(
        "%(count)d message was requeued; its lease was revoked.",
        "%(count)d messages were requeued; their leases were revoked.",
        "count",
    ),
    left_alone=_("not processing"),
)
REDRIVE = Transition(
    move=lambda service, ids, who: service.redrive_messages(ids, actor=who),
    done=ngettext_lazy(
        "%(count)d dead letter was redriven to pending (attempts reset).",
        "%(count)d dead letters were redriven to pending (attempts reset).",
        "count",
    ),
    left_alone=_("not dead"),
)


def dead_letter_transition(reason: str) -> Transition:
    return Transition(
        move=lambda service, ids, who: service.dead_letter_messages(ids, reason=reason, actor=who),
        done=ngettext_lazy(
            "%(count)d message was dead-lettered.", "%(count)d messages were dead-lettered.", "count"
        ),
        left_alone=_("already completed or dead"),
    )


def apply_transition(
    modeladmin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Message], transition: Transition
) -> None:
    """The body of every moving action: move the selection, then tell the operator what happened."""
    ids = list(queryset.order_by("id").values_list("message_id", flat=True))
    if not ids:
        modeladmin.message_user(
            request,
            _("None of the selected messages exists any more (purged meanwhile); nothing was changed."),
            messages.WARNING,
        )
        return
    try:
        moved = len(transition.move(get_service(), ids, actor(request)))
    except MessageNotFound as exc:
        modeladmin.message_user(
            request,
            _("Message %(id)s no longer exists (purged meanwhile); nothing was changed.") % {"id": exc},
            messages.ERROR,
        )
        return
    if moved:
        modeladmin.message_user(request, transition.done % {"count": moved}, messages.SUCCESS)
    skipped = len(ids) - moved
    if skipped:
        modeladmin.message_user(
            request,
            ngettext(
                "%(count)d selected message was left alone: %(why)s.",
                "%(count)d selected messages were left alone: %(why)s.",
                skipped,
            )
            % {"count": skipped, "why": transition.left_alone},
            messages.WARNING,
        )


def confirmation(
    modeladmin: ReadOnlyAdmin,
    request: HttpRequest,
    queryset: QuerySet[Message],
    *,
    action: str,
    title: Any,
    template: str,
    **context: Any,
) -> TemplateResponse:
    """The page that asks before a destructive action; its form posts the selection back."""
    opts = modeladmin.model._meta
    ctx = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "opts": opts,
        "app_label": opts.app_label,
        "action_name": action,
        "queryset": queryset.order_by("id")[:SHOWN_ON_CONFIRMATION],
        "count": queryset.count(),
        "selected": [str(pk) for pk in queryset.values_list("pk", flat=True)],
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
        "select_across": request.POST.get("select_across", "0"),
        **context,
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, template, ctx)


def confirmed(request: HttpRequest) -> bool:
    return request.POST.get("post") == "yes"


class DeadLetterForm(forms.Form):
    reason = forms.CharField(
        label=_("Reason"),
        max_length=1000,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=_("Recorded as the message's last error and in the audit trail."),
    )


# -- the actions ----------------------------------------------------------------------


@admin.action(permissions=["requeue"], description=_("Requeue stuck messages (expired lease)"))
def requeue_stuck(modeladmin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Message]) -> None:
    apply_transition(modeladmin, request, queryset, REQUEUE_STUCK)


@admin.action(
    permissions=["force_requeue"], description=_("Force-requeue: revoke a live lease (asks to confirm)")
)
def force_requeue(
    modeladmin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Message]
) -> TemplateResponse | None:
    if confirmed(request):
        apply_transition(modeladmin, request, queryset, FORCE_REQUEUE)
        return None
    processing = queryset.filter(status=Status.PROCESSING)
    live = processing.filter(lease_expires_at__gte=Now())
    return confirmation(
        modeladmin,
        request,
        queryset,
        action="force_requeue",
        title=_("Revoke live leases and requeue?"),
        template="zeroloss/admin/force_requeue_confirmation.html",
        live=live.order_by("id")[:SHOWN_ON_CONFIRMATION],
        live_count=live.count(),
        processing_count=processing.count(),
    )


@admin.action(permissions=["redrive"], description=_("Redrive dead letters back to pending"))
def redrive(modeladmin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Message]) -> None:
    apply_transition(modeladmin, request, queryset, REDRIVE)


@admin.action(permissions=["deadletter"], description=_("Dead-letter by hand (asks for a reason)"))
def dead_letter(
    modeladmin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Message]
) -> TemplateResponse | None:
    form = DeadLetterForm(request.POST if confirmed(request) else None)
    if form.is_valid():
        apply_transition(modeladmin, request, queryset, dead_letter_transition(form.cleaned_data["reason"]))
        return None
    return confirmation(
        modeladmin,
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
def purge_completed(
    modeladmin: DeskViews, request: HttpRequest, queryset: QuerySet[Message]
) -> TemplateResponse | None:
    # The retention decides what goes, not the selection: it only names the queues.
    queues = sorted(set(queryset.values_list("queue_name", flat=True)))
    if confirmed(request):
        modeladmin.purge_completed_messages(request, queues)
        return None
    return confirmation(
        modeladmin,
        request,
        queryset,
        action="purge_completed",
        title=_("Purge completed messages?"),
        template="zeroloss/admin/purge_confirmation.html",
        **modeladmin.purge_context(queues),
    )
