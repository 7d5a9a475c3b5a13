"""A message's retry policy and why it is where it is, in words (its admin page).

Both are read from what is stored (the message row and its audit trail) and from the handler
registry of the process showing the page: ``max_attempts`` is the message's own (resolved when
it was sent: ``send(max_attempts=...)``, else its handler's, else ``MAX_ATTEMPTS``); the backoff
and the exceptions retried are its handler's, when this process has it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.utils.translation import gettext as _

from ..core.durations import format_duration
from ..core.settings import get_settings
from ..core.states import Reason, Status
from ..exceptions import UnknownQueue
from ..ledger.models import Message, MessageEvent
from ..runtime.handlers import HandlerSpec, get_handler


def _names(kinds: tuple[type[BaseException], ...]) -> str:
    return ", ".join(getattr(k, "__qualname__", repr(k)) for k in kinds)


def _backoff_text(spec: HandlerSpec | None) -> str:
    if spec is not None and spec.backoff is not None:
        return _("backoff %(backoff)s (its handler's)") % {"backoff": repr(spec.backoff)}
    rb = get_settings().RETRY_BACKOFF
    return _("backoff RETRY_BACKOFF: exponential from %(base)s s, capped at %(cap)s s%(jitter)s") % {
        "base": f"{rb.BASE:g}",
        "cap": f"{rb.MAX:g}",
        "jitter": _(", full jitter") if rb.JITTER else "",
    }


def policy_text(message: Message) -> str:
    """``max 10 attempts · backoff ... · retried: ... · not retried: ... · at most N snoozes``."""
    try:
        spec: HandlerSpec | None = get_handler(message.queue_name)
    except UnknownQueue:
        spec = None
    parts = [_("at most %(n)s attempts") % {"n": message.max_attempts}, _backoff_text(spec)]
    if spec is None:
        parts.append(_("its handler is not loaded in this process"))
    else:
        if spec.retry_on:
            parts.append(_("retried only on %(kinds)s") % {"kinds": _names(spec.retry_on)})
        if spec.dont_retry_on:
            parts.append(_("never retried on %(kinds)s") % {"kinds": _names(spec.dont_retry_on)})
    parts.append(_("at most %(n)s snoozes (MAX_SNOOZES)") % {"n": get_settings().MAX_SNOOZES})
    return " · ".join(parts)


def _first_line(text: str) -> str:
    line = (text or "").partition("\n")[0]
    return line if len(line) <= 300 else line[:300] + "…"


def _clock(at: dt.datetime) -> str:
    return at.astimezone(dt.UTC).strftime("%H:%M:%S UTC")


def why_text(message: Message, events: Sequence[MessageEvent], now: dt.datetime) -> str:
    """Why it is where it is: its last move, and what comes next (on the database clock ``now``)."""
    moves = [e for e in events if e.from_status != e.to_status]
    last: Any = moves[-1] if moves else None
    snoozes = sum(1 for e in events if e.reason == Reason.SNOOZED)
    detail = _first_line(last.detail) if last is not None else ""
    status, reason = message.status, (last.reason if last is not None else "")
    when = {"n": message.attempts, "max": message.max_attempts, "detail": detail}
    if status == Status.PENDING and message.available_at is not None and message.available_at > now:
        when |= {
            "next": message.attempts + 1,
            "at": _clock(message.available_at),
            "in": format_duration((message.available_at - now).total_seconds()),
        }
        if reason == Reason.SNOOZED:
            text = _("snoozed, runs again at %(at)s (in %(in)s) as attempt %(next)s of %(max)s: %(detail)s")
        elif reason == Reason.FAILED:
            text = _("retry %(next)s of %(max)s at %(at)s (in %(in)s): %(detail)s")
        else:
            text = _("waiting until %(at)s (in %(in)s) for attempt %(next)s of %(max)s")
        text = text % when
    elif status == Status.PENDING and message.available_at is None:
        text = _("waiting behind the messages before it in its ordering key")
    elif status == Status.PENDING:
        text = _("claimable: waiting for a worker (attempt %(next)s of %(max)s)") % {
            **when,
            "next": message.attempts + 1,
        }
    elif status == Status.WAITING:
        text = _(
            "waiting for its dependencies (steps of workflow %(workflow)s) to complete: not claimable until then"
        ) % {"workflow": message.workflow_id}
    elif status == Status.PROCESSING:
        text = _("running attempt %(n)s of %(max)s") % when
    elif status == Status.DEAD and reason == Reason.DEAD_LETTERED_BY_HANDLER:
        text = _("dead-lettered by its handler at attempt %(n)s of %(max)s, not retried: %(detail)s") % when
    elif status == Status.DEAD and reason == Reason.DEAD_LETTERED:
        text = _("dead-lettered: its attempts are spent (%(n)s of %(max)s): %(detail)s") % when
    elif status == Status.DEAD:
        text = _("dead-lettered by an operator: %(detail)s") % when
    elif status == Status.COMPLETED:
        text = _("completed at attempt %(n)s of %(max)s") % when
    else:
        text = _("cancelled: %(detail)s") % when if detail else _("cancelled")
    if snoozes:
        text += " · " + _("snoozed %(n)s times") % {"n": snoozes}
    return text
