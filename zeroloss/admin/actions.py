"""The operator's actions on selected messages, in the shape of ``django.contrib.admin.actions``.

Each action is a function ``(modeladmin, request, queryset)`` decorated with
``@admin.action(permissions=[...], description=...)``: Django offers it only to operators who
hold the permission, and checks it again on POST. Destructive actions first answer with a
confirmation page and act on the confirming POST (``post=yes``). Every change goes through
:class:`~zeroloss.service.ZeroLossMessageService`, which writes the transition and its audit
row (``actor`` = the operator) atomically; feedback is pluralised with ``ngettext``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
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
#: Message ids per service call. The service checks them with one ``IN (...)`` query.
CHUNK_SIZE = 5000
#: Vanished messages named in the feedback (the count covers all of them).
NAMED_VANISHED = 10


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


def _on_key_heads(
    service: ZeroLossMessageService, ids: list[str], move: Callable[[str, str, str], str | None]
) -> list[str]:
    """Apply ``move(queue, key, message_id)`` to each message of an ordering key; the ids moved.

    The service acts only while the message is still its key's head, so a head that finished
    (or changed) since the page was read is left alone.
    """
    rows = (
        Message.objects.using(service.using)
        .filter(message_id__in=ids)
        .exclude(ordering_key="")
        .order_by("pk")
        .values_list("message_id", "queue_name", "ordering_key")
    )
    return [mid for mid, queue, key in rows if move(queue, key, mid)]


def skip_key_head_transition(reason: str) -> Transition:
    return Transition(
        move=lambda service, ids, who: _on_key_heads(
            service,
            ids,
            lambda queue, key, mid: service.skip_key_head(
                queue, key, reason=reason, actor=who, message_id=mid
            ),
        ),
        done=ngettext_lazy(
            "%(count)d key head was skipped (dead-lettered): its key moves on.",
            "%(count)d key heads were skipped (dead-lettered): their keys move on.",
            "count",
        ),
        left_alone=_("not the head of an ordering key (any more)"),
    )


REQUEUE_KEY_HEAD = Transition(
    move=lambda service, ids, who: _on_key_heads(
        service, ids, lambda queue, key, mid: service.requeue_key_head(queue, key, actor=who, message_id=mid)
    ),
    done=ngettext_lazy(
        "%(count)d stuck key head was requeued; it stays first in its key.",
        "%(count)d stuck key heads were requeued; each stays first in its key.",
        "count",
    ),
    left_alone=_(
        "not a stuck key head (a retry backing off runs on its own; a live lease needs force-requeue)"
    ),
)


def message_id_chunks(queryset: QuerySet[Message], size: int = CHUNK_SIZE) -> Iterator[list[str]]:
    """The selection's message ids, at most ``size`` at a time, in primary-key order.

    Keyset pages (``pk > last``) over the selection's own query: a "select all" of a million
    rows is read and moved 5,000 at a time, never as one ``IN`` list (PostgreSQL takes at
    most 65,535 bind parameters in a statement). A message moved out of the filter by an
    earlier chunk is behind the cursor already, so nothing is read twice or skipped.
    """
    rows = queryset.order_by("pk").values_list("pk", "message_id")
    last: int | None = None
    while True:
        page = list((rows if last is None else rows.filter(pk__gt=last))[:size])
        if page:
            yield [message_id for _pk, message_id in page]
        if len(page) < size:
            return
        last = page[-1][0]


def _move_chunk(
    service: ZeroLossMessageService, transition: Transition, ids: list[str], who: str
) -> tuple[int, list[str]]:
    """Move one chunk: ``(how many moved, ids that no longer exist)``.

    The service refuses a call naming a message that is gone (deleted or purged since the
    selection was read) and changes nothing; the rest of the chunk is then moved without it.
    Every retry drops at least the id the service named, so this ends.
    """
    vanished: list[str] = []
    while ids:
        try:
            return len(transition.move(service, ids, who)), vanished
        except MessageNotFound as exc:
            present = set(
                Message.objects.using(service.using)
                .filter(message_id__in=ids)
                .values_list("message_id", flat=True)
            )
            gone = [m for m in ids if m not in present or m == exc.message_id]
            vanished += gone
            ids = [m for m in ids if m not in gone]
    return 0, vanished


def apply_transition(
    modeladmin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Message], transition: Transition
) -> None:
    """The body of every moving action: move the selection chunk by chunk, then say what happened."""
    service = get_service()
    who = actor(request)
    selected = moved = 0
    vanished: list[str] = []
    for ids in message_id_chunks(queryset):
        selected += len(ids)
        done, gone = _move_chunk(service, transition, ids, who)
        moved += done
        vanished += gone
    if not selected:
        modeladmin.message_user(
            request,
            _("None of the selected messages exists any more (purged meanwhile); nothing was changed."),
            messages.WARNING,
        )
        return
    if moved:
        modeladmin.message_user(request, transition.done % {"count": moved}, messages.SUCCESS)
    if vanished:
        modeladmin.message_user(request, _vanished_text(vanished), messages.WARNING)
    skipped = selected - moved - len(vanished)
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


def _vanished_text(ids: list[str]) -> str:
    named = ", ".join(f"'{m}'" for m in ids[:NAMED_VANISHED])
    if len(ids) > NAMED_VANISHED:
        named += ", …"
    return ngettext(
        "Message %(ids)s no longer exists (deleted or purged meanwhile); it was left out.",
        "%(count)d selected messages no longer exist (deleted or purged meanwhile): %(ids)s; "
        "they were left out.",
        len(ids),
    ) % {"count": len(ids), "ids": named}


def select_across(request: HttpRequest) -> bool:
    """Did the operator pick "Select all N messages" (every row the changelist's filter matches)?"""
    return bool(forms.BooleanField(required=False).to_python(request.POST.get("select_across")))


def selection_fields(request: HttpRequest) -> list[tuple[str, str]]:
    """The hidden fields that carry the selection to the confirming POST.

    Chosen rows travel as their primary keys (a page holds at most ``list_max_show_all``).
    "Select all" travels as the flag, and the changelist's filters, search and ordering as
    the form's URL, never as ids: a confirmation form of one field per row would pass
    ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` (1,000) and be refused. Django's changelist still wants
    one row named before it runs an action, so the first chosen row is carried along; with
    ``select_across`` it only opens the door (the filter decides what is acted on).
    """
    chosen = request.POST.getlist(ACTION_CHECKBOX_NAME)
    if select_across(request):
        return [("select_across", "1"), *((ACTION_CHECKBOX_NAME, pk) for pk in chosen[:1])]
    return [("select_across", "0"), *((ACTION_CHECKBOX_NAME, pk) for pk in chosen)]


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
        "select_across": select_across(request),
        "selection_fields": selection_fields(request),
        # The changelist's own URL, query string included: its filters are the selection.
        "form_url": request.get_full_path(),
        **context,
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, template, ctx)


def confirmed(request: HttpRequest) -> bool:
    return request.POST.get("post") == "yes"


class SkipKeyHeadForm(forms.Form):
    reason = forms.CharField(
        label=_("Reason"),
        max_length=1000,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text=_('Recorded as "key skipped: <reason>" in the head\'s last error and audit trail.'),
    )


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


#: The actions the *Blocked keys* page offers on a key's head, by name.
KEY_ACTIONS = {"skip_key_head": skip_key_head, "requeue_key_head": requeue_key_head}
