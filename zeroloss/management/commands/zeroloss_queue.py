"""``manage.py zeroloss_queue pause|resume|limit|show``: a queue's runtime control (docs/control.md).

- ``pause Q``: no worker claims the queue's messages any more (each within 1 s); what runs
  finishes normally, and sends are accepted and wait.
- ``resume Q``: the queue is claimed again (idle workers are woken at once on PostgreSQL).
- ``limit Q [--concurrency N] [--rate R] [--clear]``: override the queue's limits from
  ``ZEROLOSS["QUEUES"]`` (``--clear``: drop the overrides, the settings' apply again). An
  option not given keeps its current override.
- ``show``: every queue with a control or a limit: paused, the limits in effect (and where
  they come from), what is processing and pending, who changed it last and when.

The queue must be known: a handler of this process, a ``ZEROLOSS["QUEUES"]`` entry, or a queue
with a control row already; otherwise exit code 2 (a typo would pause nothing). The change is
made on the queue's ledger (``QUEUE_DATABASES``) unless ``--database`` names another.

Exit codes: 0 done; 2 bad arguments (unknown queue, bad ``--rate``/``--concurrency``: nothing
changed); 4 the ledger could not be reached.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from ...core.rates import parse_concurrency, parse_rate
from ...core.settings import get_settings
from ...exceptions import InvalidMessage
from ...ledger.limits import QueueState
from ...ledger.models import QueueControl
from ...ledger.service import ZeroLossMessageService
from ...ledger.validation import validate_queue_name
from ...ops.snapshot import invalidate
from ...runtime.handlers import registered_queues
from ..base import ZeroLossCommand

ACTIONS = ("pause", "resume", "limit", "show")


class Command(ZeroLossCommand):
    help = gettext_noop(
        "Pause or resume a queue, override its concurrency and rate limits, or show every queue's control."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=ACTIONS, help=_("What to do."))
        parser.add_argument("queue", nargs="?", help=_("The queue (pause, resume, limit)."))
        parser.add_argument(
            "--concurrency",
            default=None,
            help=_("limit: at most N messages of the queue processing at once, across every worker."),
        )
        parser.add_argument(
            "--rate",
            default=None,
            help=_('limit: at most N claims started per period: "10/s", "600/m", "1000/h".'),
        )
        parser.add_argument(
            "--clear", action="store_true", help=_("limit: drop the overrides (the settings' limits apply).")
        )

    def handle(self, *, action: str, queue: str | None, json: bool, **options: Any) -> None:
        if action == "show":
            if queue:
                self.usage_error(_("show takes no QUEUE (got %(queue)s)") % {"queue": repr(queue)})
            service = self.service(options)
            self._show(service.queue_states(), as_json=json)
            return
        if not queue:
            self.usage_error(_("%(action)s needs a QUEUE") % {"action": action})
        if action != "limit" and (options["concurrency"] or options["rate"] or options["clear"]):
            self.usage_error(_("--concurrency, --rate and --clear are options of limit"))
        if options["database"] == "default":
            options["database"] = get_settings().QUEUE_DATABASES.get(queue, "default")
        service = self.service(options)
        self._check_known(service, queue)
        actor = self.actor()
        if action == "pause":
            service.pause_queue(queue, actor=actor)
        elif action == "resume":
            service.resume_queue(queue, actor=actor)
        else:
            self._limit(service, queue, options, actor)
        invalidate(service)
        state = next((s for s in service.queue_states() if s.queue_name == queue), None)
        if json:
            self.emit_json(
                {"action": action, "queue": self._state_dict(state) if state else {"queue": queue}}
            )
        elif state is not None:
            self.stdout.write(self._summary(action, state))
        else:
            self.stdout.write(_("%(queue)s: no limit and not paused") % {"queue": queue})

    def _check_known(self, service: ZeroLossMessageService, queue: str) -> None:
        try:
            validate_queue_name(queue)
            known = (
                queue in registered_queues()
                or queue in service.settings.QUEUES
                or QueueControl.objects.using(service.using).filter(queue_name=queue).exists()
            )
        except InvalidMessage as exc:
            self.usage_error(str(exc))
        if not known:
            self.usage_error(
                _(
                    "unknown queue %(queue)s: no handler of this process, no ZEROLOSS['QUEUES'] entry and "
                    "no control row names it (known: %(known)s)"
                )
                % {
                    "queue": repr(queue),
                    "known": ", ".join(sorted({*registered_queues(), *service.settings.QUEUES})),
                }
            )

    def _limit(
        self, service: ZeroLossMessageService, queue: str, options: dict[str, Any], actor: str
    ) -> None:
        if options["clear"]:
            if options["concurrency"] is not None or options["rate"] is not None:
                self.usage_error(_("--clear takes no --concurrency or --rate"))
            service.clear_queue_limits(queue, actor=actor)
            return
        if options["concurrency"] is None and options["rate"] is None:
            self.usage_error(_("limit needs --concurrency N, --rate R or --clear"))
        current = {s.queue_name: s for s in service.queue_states()}.get(queue)
        concurrency = current.concurrency_override if current else None
        rate = current.rate_override.text if current and current.rate_override else None
        if options["concurrency"] is not None:
            try:
                concurrency = parse_concurrency(int(options["concurrency"]))
            except ValueError:
                self.usage_error(
                    _("--concurrency must be an integer from 1, got %(value)s")
                    % {"value": repr(options["concurrency"])}
                )
        if options["rate"] is not None:
            try:
                rate = parse_rate(options["rate"]).text
            except ValueError:
                self.usage_error(
                    _('--rate must be "N/s", "N/m" or "N/h" (e.g. "10/s"), got %(value)s')
                    % {"value": repr(options["rate"])}
                )
        service.limit_queue(queue, concurrency=concurrency, rate=rate, actor=actor)

    def _summary(self, action: str, state: QueueState) -> str:
        return _("%(queue)s: %(paused)s, concurrency %(concurrency)s, rate %(rate)s") % {
            "queue": state.queue_name,
            "paused": _("paused") if state.paused else _("not paused"),
            "concurrency": state.limits.concurrency
            if state.limits.concurrency is not None
            else _("unlimited"),
            "rate": state.limits.rate or _("unlimited"),
        }

    @staticmethod
    def _state_dict(state: QueueState) -> dict[str, Any]:
        return {
            "queue": state.queue_name,
            "paused": state.paused,
            "concurrency": state.limits.concurrency,
            "rate": state.limits.rate.text if state.limits.rate else None,
            "concurrency_override": state.concurrency_override,
            "rate_override": state.rate_override.text if state.rate_override else None,
            "processing": state.processing,
            "pending": state.pending,
            "changed_by": state.changed_by,
            "changed_at": state.changed_at.isoformat() if state.changed_at else None,
        }

    def _show(self, states: list[QueueState], *, as_json: bool) -> None:
        if as_json:
            self.emit_json({"queues": [self._state_dict(s) for s in states]})
            return
        if not states:
            self.stdout.write(_("no queue is paused or limited"))
            return

        def source(override: object, value: object) -> str:
            if value is None:
                return "-"
            return f"{value}" + ("" if override is not None else " " + _("(settings)"))

        self.table(
            [
                _("queue"),
                _("paused"),
                _("concurrency"),
                _("rate"),
                _("processing"),
                _("pending"),
                _("changed by"),
            ],
            [
                [
                    s.queue_name,
                    _("yes") if s.paused else _("no"),
                    source(s.concurrency_override, s.limits.concurrency),
                    source(s.rate_override, s.limits.rate),
                    s.processing,
                    s.pending,
                    s.changed_by or "-",
                ]
                for s in states
            ],
        )
