"""The *Queues* page (``admin/zeroloss/queuecontrol/queues/``): every queue, and its controls.

Every queue that is declared (``ZEROLOSS["QUEUES"]``, a handler in this process), seen in the
ledger, scheduled or controlled gets a row: its messages by status and the oldest pending
message's age (the cached snapshot the dashboard shows), what completed in the last
:data:`THROUGHPUT_MINUTES` minutes, paused or running, its limits in effect and who changed
them. Pause, resume and limits act on any of them, a queue without a control row too: each asks
to confirm, needs the control permission, and goes through the ledger's own operations, which
record the operator on the queue's control row and log the change (docs/control.md).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.core.exceptions import BadRequest, PermissionDenied
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext_lazy as _

from ..core.rates import MAX_LIMIT, parse_concurrency, parse_rate
from ..core.settings import get_settings
from ..exceptions import ZeroLossError
from ..ledger.models import Message, Status
from ..ops.snapshot import format_duration, get_snapshot
from ..runtime.handlers import registered_queues
from ..runtime.schedules.scheduler import load_schedules
from ..runtime.schedules.spec import ScheduleError
from .base import actor, get_service

if TYPE_CHECKING:
    from ..ledger.service import ZeroLossMessageService

#: The throughput column: messages completed in this many last minutes (database clock).
THROUGHPUT_MINUTES = 5
#: What the page's actions do, by the ``action`` field of their POST.
ACTIONS = ("pause", "resume", "limit")


@dataclass(frozen=True)
class QueueLine:
    """One queue on the page."""

    name: str
    counts: list[int]  # in Status order
    total: int
    completed_recently: int
    oldest_pending: str
    paused: bool
    concurrency: int | None
    rate: str
    #: The control row's overrides (None / "": the setting's limit applies).
    override_concurrency: int | None
    override_rate: str
    changed_by: str
    changed_at: dt.datetime | None
    #: Where the queue was found: declared, handler, ledger, schedule, control.
    sources: tuple[str, ...]

    @property
    def per_minute(self) -> str:
        return f"{self.completed_recently / THROUGHPUT_MINUTES:.1f}"


def _scheduled_queues(service: ZeroLossMessageService) -> set[str]:

    try:
        specs = load_schedules(service.using, check_targets=False)
    except ScheduleError:  # a bad settings schedule: the system checks say so, the page still shows
        return set()
    return {spec.queue for spec in specs.values() if spec.queue}


def queue_lines(service: ZeroLossMessageService, *, refresh: bool = False) -> tuple[list[QueueLine], Any]:
    """Every queue's line, by name, and the snapshot they were read from."""
    snap = get_snapshot(service, use_cache=not refresh)
    states = {s.queue_name: s for s in service.queue_states()}
    declared = set(get_settings().QUEUES)
    handlers = set(registered_queues())
    in_ledger = {name for name, q in snap.queues.items() if q.total}
    scheduled = _scheduled_queues(service)
    since = snap.taken_at - dt.timedelta(minutes=THROUGHPUT_MINUTES)
    recent = dict(
        Message.objects.using(service.using)
        .filter(status=Status.COMPLETED, completed_at__gte=since)
        .values("queue_name")
        .annotate(n=Count("*"))
        .order_by()
        .values_list("queue_name", "n")
    )
    statuses = list(Status.values)
    lines = []
    for name in sorted(declared | handlers | in_ledger | scheduled | set(states) | set(snap.queues)):
        q = snap.queues.get(name)
        state = states.get(name)
        found = (
            ("declared", name in declared),
            ("handler", name in handlers),
            ("ledger", name in in_ledger),
            ("schedule", name in scheduled),
            ("control", state is not None and bool(state.changed_by)),  # an operator set something
        )
        limits = state.limits if state is not None else service.queue_limits(name)
        lines.append(
            QueueLine(
                name=name,
                counts=[q.counts.get(s, 0) if q else 0 for s in statuses],
                total=q.total if q else 0,
                completed_recently=recent.get(name, 0),
                oldest_pending=format_duration(q.oldest_pending_age)
                if q and q.oldest_pending_age is not None
                else "",
                paused=state.paused if state is not None else False,
                concurrency=limits.concurrency,
                rate=str(limits.rate) if limits.rate else "",
                override_concurrency=state.concurrency_override if state is not None else None,
                override_rate=str(state.rate_override) if state is not None and state.rate_override else "",
                changed_by=state.changed_by if state is not None else "",
                changed_at=state.changed_at if state is not None else None,
                sources=tuple(label for label, yes in found if yes),
            )
        )
    return lines, snap


if TYPE_CHECKING:
    from .base import ReadOnlyAdmin as _Admin
else:
    _Admin = object


class QueuePageViews(_Admin):
    """The page and its actions (mixed into :class:`~zeroloss.admin.queues.QueueControlAdmin`,
    which has ``has_control_permission``)."""

    def has_control_permission(self, request: HttpRequest) -> bool:
        raise NotImplementedError

    def queue_page_urls(self) -> list[URLPattern]:
        return [
            path("queues/", self.admin_site.admin_view(self.queues_view), name="zeroloss_queuecontrol_queues")
        ]

    def _context(self, request: HttpRequest, title: Any) -> dict[str, Any]:
        opts = self.model._meta
        return {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": opts,
            "app_label": opts.app_label,
            "queues_url": reverse(f"{self.admin_site.name}:zeroloss_queuecontrol_queues"),
        }

    def queues_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self._act(request)
        service = get_service()
        lines, snap = queue_lines(service, refresh=request.GET.get("refresh") == "1")
        context = {
            **self._context(request, _("Queues")),
            "lines": lines,
            "status_headers": [(s, str(Status(s).label)) for s in Status.values],
            "database_now": snap.taken_at,
            "throughput_minutes": THROUGHPUT_MINUTES,
            "can_control": self.has_control_permission(request),
            "messages_url": reverse(f"{self.admin_site.name}:zeroloss_message_changelist"),
            "dashboard_url": reverse(f"{self.admin_site.name}:zeroloss_message_dashboard"),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "zeroloss/admin/queues.html", context)

    def _act(self, request: HttpRequest) -> HttpResponse:
        """A pause, resume or limit of one queue: asked first, done on the confirming POST."""
        if not self.has_control_permission(request):
            raise PermissionDenied(_("You may not pause, resume or limit queues."))
        action = request.POST.get("action", "")
        queue = request.POST.get("queue", "")
        if action not in ACTIONS or not queue:
            raise BadRequest("A queue action needs action=pause|resume|limit and a queue.")
        concurrency = request.POST.get("concurrency", "").strip()
        rate = request.POST.get("rate", "").strip()
        url = reverse(f"{self.admin_site.name}:zeroloss_queuecontrol_queues")
        if request.POST.get("post") == "yes":
            try:
                self._apply(request, action, queue, concurrency, rate)
            except (ValueError, ZeroLossError) as exc:
                # Nothing changed: say why, and ask again with what was typed.
                self.message_user(request, str(exc), messages.ERROR)
                return self._confirm(request, action, queue, concurrency, rate, error=str(exc))
            return HttpResponseRedirect(url)
        if action == "limit" and "concurrency" not in request.POST:
            state = next((s for s in get_service().queue_states() if s.queue_name == queue), None)
            if state is not None:  # the form starts from the overrides in place
                concurrency = "" if state.concurrency_override is None else str(state.concurrency_override)
                rate = str(state.rate_override) if state.rate_override else ""
        return self._confirm(request, action, queue, concurrency, rate)

    def _apply(self, request: HttpRequest, action: str, queue: str, concurrency: str, rate: str) -> None:
        service = get_service()
        who = actor(request)
        if action == "pause":
            service.pause_queue(queue, actor=who)
            done = _("Paused queue %(queue)s: no worker claims its messages any more.")
        elif action == "resume":
            service.resume_queue(queue, actor=who)
            done = _("Resumed queue %(queue)s: workers claim its messages again.")
        else:
            limit = None
            if concurrency:
                try:
                    limit = parse_concurrency(int(concurrency))
                except ValueError:
                    raise ValueError(
                        _(
                            "Concurrency must be a whole number from 1 to %(max)d, or empty for no "
                            "override; got %(value)r. Nothing was changed."
                        )
                        % {"max": MAX_LIMIT, "value": concurrency}
                    ) from None
            if rate:
                try:
                    parse_rate(rate)
                except ValueError:
                    raise ValueError(
                        _(
                            'Rate must be "N/s", "N/m" or "N/h" (e.g. "10/s"), or empty for no override; '
                            "got %(value)r. Nothing was changed."
                        )
                        % {"value": rate}
                    ) from None
            service.limit_queue(queue, concurrency=limit, rate=rate or None, actor=who)
            done = _("Set the limits of queue %(queue)s: concurrency %(concurrency)s, rate %(rate)s.")
        self.message_user(
            request,
            done % {"queue": queue, "concurrency": concurrency or "-", "rate": rate or "-"},
            messages.SUCCESS,
        )

    def _confirm(
        self, request: HttpRequest, action: str, queue: str, concurrency: str, rate: str, *, error: str = ""
    ) -> TemplateResponse:
        titles = {
            "pause": _("Pause queue %(queue)s?"),
            "resume": _("Resume queue %(queue)s?"),
            "limit": _("Set the limits of queue %(queue)s"),
        }
        context = {
            **self._context(request, titles[action] % {"queue": queue}),
            "action": action,
            "queue": queue,
            "concurrency": concurrency,
            "rate": rate,
            "error": error,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "zeroloss/admin/queue_action_confirmation.html", context)
