"""How an admin action moves its selection: the service call, chunk by chunk, and the feedback.

An :class:`AdminMove` names the service call that moves messages and what to tell the operator
after; :func:`apply_transition` runs it over a selection of any size (keyset chunks of
:data:`CHUNK_SIZE`), leaves out messages purged meanwhile and says what moved, what vanished
and what was left alone. Every change goes through
:class:`~zeroloss.service.ZeroLossMessageService`, which writes the transition and its audit
row (``actor`` = the operator) atomically.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext, ngettext_lazy

from ..exceptions import MessageNotFound
from ..ledger.models import Message
from ..ledger.service import ZeroLossMessageService
from .base import ReadOnlyAdmin, actor, get_service

#: Message ids per service call. The service checks them with one ``IN (...)`` query.
CHUNK_SIZE = 5000
#: Vanished messages named in the feedback (the count covers all of them).
NAMED_VANISHED = 10


@dataclass(frozen=True)
class AdminMove:
    """One operator transition: the service call that moves messages, and what to say after.

    ``move(service, message_ids, actor)`` returns the ids it moved. ``done`` is an
    ``ngettext_lazy`` message with a ``%(count)d``; ``left_alone`` says why the rest stayed.
    """

    move: Callable[[ZeroLossMessageService, list[str], str], Sequence[str]]
    done: Any
    left_alone: Any


REQUEUE_STUCK = AdminMove(
    move=lambda service, ids, who: service.requeue_messages(ids, actor=who),
    done=ngettext_lazy(
        "%(count)d stuck message was requeued.", "%(count)d stuck messages were requeued.", "count"
    ),
    left_alone=_("not stuck (no expired lease); use force-requeue for a live one"),
)
FORCE_REQUEUE = AdminMove(
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
REDRIVE = AdminMove(
    move=lambda service, ids, who: service.redrive_messages(ids, actor=who),
    done=ngettext_lazy(
        "%(count)d dead letter was redriven to pending (attempts reset).",
        "%(count)d dead letters were redriven to pending (attempts reset).",
        "count",
    ),
    left_alone=_("not dead"),
)


def _cancelled(service: ZeroLossMessageService, ids: list[str], who: str, *, abort: bool) -> list[str]:
    """The ids the cancel moved (cancelled) or, with ``abort``, asked to stop."""
    return [r.message_id for r in service.cancel_messages(ids, abort=abort, actor=who) if r.ok]


CANCEL = AdminMove(
    move=lambda service, ids, who: _cancelled(service, ids, who, abort=False),
    done=ngettext_lazy(
        "%(count)d pending message was cancelled.", "%(count)d pending messages were cancelled.", "count"
    ),
    left_alone=_("not pending (a processing message needs Abort; finished ones stay as they are)"),
)
ABORT = AdminMove(
    move=lambda service, ids, who: _cancelled(service, ids, who, abort=True),
    done=ngettext_lazy(
        "%(count)d message was cancelled or asked to stop (cancelled when its handler ends).",
        "%(count)d messages were cancelled or asked to stop (cancelled when their handlers end).",
        "count",
    ),
    left_alone=_("already finished, cancelled, or asked to stop"),
)


def dead_letter_transition(reason: str) -> AdminMove:
    return AdminMove(
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


def skip_key_head_transition(reason: str) -> AdminMove:
    return AdminMove(
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


REQUEUE_KEY_HEAD = AdminMove(
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
    service: ZeroLossMessageService, transition: AdminMove, ids: list[str], who: str
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
    modeladmin: ReadOnlyAdmin, request: HttpRequest, queryset: QuerySet[Message], transition: AdminMove
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
