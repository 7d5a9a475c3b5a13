"""The operator's actions on selected messages, in the shape of ``django.contrib.admin.actions``.

Each action is a function ``(modeladmin, request, queryset)`` decorated with
``@admin.action(permissions=[...], description=...)``: Django offers it only to operators who
hold the permission, and checks it again on POST. Destructive actions first answer with a
confirmation page and act on the confirming POST (``post=yes``; :mod:`zeroloss.admin.confirm`).
Moving actions apply a :class:`~zeroloss.admin.transitions.AdminMove` to the selection
(:mod:`zeroloss.admin.transitions`): every change goes through
:class:`~zeroloss.service.ZeroLossMessageService`, which writes the transition and its audit
row (``actor`` = the operator) atomically; feedback is pluralised with ``ngettext``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.translation import gettext_lazy as _

from ..ledger.models import Message, Status
from .base import ReadOnlyAdmin
from .confirm import SHOWN_ON_CONFIRMATION, DeadLetterForm, SkipKeyHeadForm, confirmation, confirmed
from .transitions import (
    ABORT,
    CANCEL,
    FORCE_REQUEUE,
    REDRIVE,
    REQUEUE_KEY_HEAD,
    REQUEUE_STUCK,
    apply_transition,
    dead_letter_transition,
    skip_key_head_transition,
)

if TYPE_CHECKING:
    from .views import DeskViews

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
    live_count = live.count()
    return confirmation(
        modeladmin,
        request,
        queryset,
        action="force_requeue",
        # No live lease among them: nothing is revoked, so no warning to heed.
        title=_("Revoke live leases and requeue?") if live_count else _("Requeue the selected messages?"),
        template="zeroloss/admin/force_requeue_confirmation.html",
        live=live.order_by("id")[:SHOWN_ON_CONFIRMATION],
        live_count=live_count,
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
    queues = list(queryset.order_by("queue_name").values_list("queue_name", flat=True).distinct())
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


@admin.action(
    permissions=["deadletter"],
    description=_(
        "Skip the head of its ordering key: dead-letter it so the key moves on (asks for a reason)"
    ),
)
def skip_key_head(
    modeladmin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Message]
) -> TemplateResponse | None:
    form = SkipKeyHeadForm(request.POST if confirmed(request) else None)
    if form.is_valid():
        apply_transition(modeladmin, request, queryset, skip_key_head_transition(form.cleaned_data["reason"]))
        return None
    return confirmation(
        modeladmin,
        request,
        queryset,
        action="skip_key_head",
        title=_("Skip the head of an ordering key"),
        template="zeroloss/admin/skip_key_head_form.html",
        form=form,
        live_count=queryset.filter(status=Status.PROCESSING, lease_expires_at__gte=Now()).count(),
    )


@admin.action(permissions=["requeue"], description=_("Requeue a stuck head of its ordering key"))
def requeue_key_head(modeladmin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Message]) -> None:
    apply_transition(modeladmin, request, queryset, REQUEUE_KEY_HEAD)


@admin.action(permissions=["cancel"], description=_("Cancel pending messages (asks to confirm)"))
def cancel(
    modeladmin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Message]
) -> TemplateResponse | None:
    if confirmed(request):
        apply_transition(modeladmin, request, queryset, CANCEL)
        return None
    return confirmation(
        modeladmin,
        request,
        queryset,
        action="cancel",
        title=_("Cancel messages?"),
        template="zeroloss/admin/cancel_confirmation.html",
        abort=False,
        pending_count=queryset.filter(status=Status.PENDING).count(),
        processing_count=queryset.filter(status=Status.PROCESSING).count(),
    )


@admin.action(
    permissions=["abort"], description=_("Abort: cancel pending and stop running messages (asks to confirm)")
)
def abort(
    modeladmin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Message]
) -> TemplateResponse | None:
    if confirmed(request):
        apply_transition(modeladmin, request, queryset, ABORT)
        return None
    processing = queryset.filter(status=Status.PROCESSING)
    return confirmation(
        modeladmin,
        request,
        queryset,
        action="abort",
        title=_("Abort messages?"),
        template="zeroloss/admin/cancel_confirmation.html",
        abort=True,
        pending_count=queryset.filter(status=Status.PENDING).count(),
        processing_count=processing.count(),
        live=processing.order_by("id")[:SHOWN_ON_CONFIRMATION],
    )


#: The actions the *Blocked keys* page offers on a key's head, by name.
KEY_ACTIONS = {"skip_key_head": skip_key_head, "requeue_key_head": requeue_key_head}
