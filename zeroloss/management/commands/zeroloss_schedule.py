"""``manage.py zeroloss_schedule``: list schedules, preview their ticks, send one now, enable or
disable one, or run the scheduler.

    zeroloss_schedule list
    zeroloss_schedule preview NAME [--next N]
    zeroloss_schedule run NAME
    zeroloss_schedule enable NAME     # a database schedule, as the admin's Enable
    zeroloss_schedule disable NAME
    zeroloss_schedule --loop          # the scheduler alone (every zeroloss_worker runs one too)

Exit codes: 0 done (enabling an enabled schedule too: nothing changed); 2 bad arguments (an
unknown schedule name, a settings schedule to enable or disable, a bad settings schedule: the
message says what to fix); 4 the database could not be reached (or, with ``--loop``, stayed
unreachable longer than ``DB_OUTAGE_TOLERANCE``).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from ...core.outage import Backoff, OutageMonitor, OutageTooLong
from ...runtime.schedules.models import Schedule, ScheduleState
from ...runtime.schedules.scheduler import Scheduler, load_schedules
from ...runtime.schedules.spec import ScheduleError, settings_schedules
from ...runtime.schedules.ticks import next_tick
from ...runtime.sweep_loop import StopFlag
from ...runtime.worker.sessions import harden_sessions
from ..base import EXIT_UNREACHABLE, ZeroLossCommand, positive_int

ACTIONS = ["list", "preview", "run", "enable", "disable"]


class Command(ZeroLossCommand):
    help = gettext_noop(
        "List schedules, preview a schedule's next ticks, send one now, enable or disable one, "
        "or run the scheduler (--loop)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", nargs="?", choices=ACTIONS, help=_("What to do."))
        parser.add_argument("name", nargs="?", help=_("The schedule (preview, run, enable, disable)."))
        parser.add_argument(
            "--next", type=positive_int, default=5, help=_("preview: how many ticks (default 5).")
        )
        parser.add_argument("--loop", action="store_true", help=_("Run the scheduler until SIGTERM/SIGINT."))
        parser.add_argument(
            "--max-rounds", type=positive_int, help=_("With --loop: stop after this many rounds.")
        )

    def handle(
        self,
        *,
        action: str | None,
        name: str | None,
        next: int,
        loop: bool,
        max_rounds: int | None,
        json: bool,
        verbosity: int,
        **options: Any,
    ) -> None:
        service = self.service(options)
        if loop == (action is not None):
            self.usage_error(
                _("give one of: list, preview NAME, run NAME, enable NAME, disable NAME, --loop")
            )
        if action not in (None, "list") and not name:
            self.usage_error(_("%(action)s needs a schedule NAME") % {"action": action})
        try:
            if loop:
                return self._loop(service.using, max_rounds, json, verbosity)
            scheduler = Scheduler(service.using, instance_id=f"cli:{self.command_name()}")
            if action == "list":
                return self._list(scheduler, json)
            assert name is not None
            if action in ("enable", "disable"):
                return self._enable(scheduler, name, action == "enable", json)
            if name not in load_schedules(service.using):
                known = ", ".join(sorted(load_schedules(service.using))) or _("none")
                self.usage_error(
                    _("unknown schedule %(name)r (schedules: %(known)s)") % {"name": name, "known": known}
                )
        except ScheduleError as exc:
            self.usage_error(str(exc))
        if action == "preview":
            now = scheduler.read_clock()[0]
            ticks = scheduler.preview(name, next, after=now)
            spec = scheduler.spec(name)
            if json:
                self.emit_json(
                    {
                        "name": name,
                        "now": now.isoformat(),
                        "ticks": [t.isoformat() for t in ticks],
                        "message_ids": [spec.message_id(t) for t in ticks],
                    }
                )
            else:
                self.table(
                    [
                        _("tick (UTC)"),
                        _("local (%(timezone)s)") % {"timezone": spec.timezone},
                        _("message id"),
                    ],
                    [[t.isoformat(), t.astimezone(spec.tz).isoformat(), spec.message_id(t)] for t in ticks],
                )
            return
        message_id = scheduler.run_now(name)
        if json:
            self.emit_json({"name": name, "message_id": message_id})
        else:
            self.stdout.write(_("sent %(message_id)s") % {"message_id": message_id})

    def _enable(self, scheduler: Scheduler, name: str, enabled: bool, json: bool) -> None:
        """The admin's Enable/Disable (:meth:`Schedule.set_enabled`): enabling starts the schedule
        at the database clock, its next tick the first after it; every write bumps its revision."""

        if name in settings_schedules(check_targets=False):
            self.usage_error(
                _(
                    "schedule %(name)r is defined in settings: set its 'enabled' in ZEROLOSS['SCHEDULES'] "
                    "and deploy (enable and disable change database schedules)"
                )
                % {"name": name}
            )
        row = Schedule.objects.using(scheduler.using).filter(name=name).first()
        if row is None:
            known = ", ".join(sorted(Schedule.objects.using(scheduler.using).values_list("name", flat=True)))
            self.usage_error(
                _("unknown schedule %(name)r (database schedules: %(known)s)")
                % {"name": name, "known": known or _("none")}
            )
        changed = row.enabled != enabled
        if changed:
            row.set_enabled(enabled)
        upcoming = None
        if enabled:
            spec = load_schedules(scheduler.using, check_targets=False).get(name)
            upcoming = next_tick(spec, scheduler.read_clock()[0]) if spec is not None else None
        if json:
            self.emit_json(
                {
                    "name": name,
                    "enabled": enabled,
                    "changed": changed,
                    "next_tick": upcoming.isoformat() if upcoming else None,
                }
            )
            return
        if enabled:
            text = (
                _("%(name)s: enabled, next tick %(tick)s")
                if changed
                else _("%(name)s: already enabled, next tick %(tick)s")
            )
            self.stdout.write(text % {"name": name, "tick": upcoming.isoformat() if upcoming else "-"})
        else:
            text = _("%(name)s: disabled") if changed else _("%(name)s: already disabled")
            self.stdout.write(text % {"name": name})

    def _list(self, scheduler: Scheduler, json: bool) -> None:

        now = scheduler.read_clock()[0]
        specs = load_schedules(scheduler.using)
        states = {
            s.name: s for s in ScheduleState.objects.using(scheduler.using).filter(name__in=list(specs))
        }
        rows = []
        for spec in specs.values():
            state = states.get(spec.name)
            upcoming = next_tick(spec, now) if spec.enabled else None
            rows.append(
                {
                    **spec.as_dict(),
                    "next_tick": upcoming.isoformat() if upcoming else None,
                    "last_sent": state.last_sent.isoformat() if state and state.last_sent else None,
                }
            )
        if json:
            self.emit_json({"now": now.isoformat(), "schedules": rows})
            return
        self.table(
            [
                _("name"),
                _("source"),
                _("when"),
                _("target"),
                _("enabled"),
                _("next tick (UTC)"),
                _("last sent"),
            ],
            [
                [
                    r["name"],
                    r["source"],
                    spec.when,
                    r["task"] or r["queue"],
                    _("yes") if r["enabled"] else _("no"),
                    r["next_tick"] or "-",
                    r["last_sent"] or "-",
                ]
                for r, spec in zip(rows, specs.values(), strict=True)
            ],
        )

    def _loop(self, using: str, max_rounds: int | None, json: bool, verbosity: int) -> None:

        stop = StopFlag()
        scheduler = Scheduler(using, instance_id=f"cli:{self.command_name()}", stop=stop)
        harden_sessions([using], scheduler.service.settings.DEAD_PEER_TIMEOUT)
        monitor = OutageMonitor.for_alias(using)
        backoff = Backoff()
        rounds = sent = 0
        with stop.on_signals():
            self.log(
                _("zeroloss_schedule: a round every %(interval)ss (Ctrl-C or SIGTERM stops)")
                % {"interval": f"{scheduler.interval:g}"}
            )
            while not stop and (max_rounds is None or rounds < max_rounds):
                try:
                    ok, report = monitor.attempt(
                        scheduler.run_once,
                        who="the scheduler",
                        backoff=backoff,
                        wait=stop.wait,
                        tolerance=scheduler.service.settings.DB_OUTAGE_TOLERANCE,
                    )
                except OutageTooLong as exc:
                    raise CommandError(str(exc), returncode=EXIT_UNREACHABLE) from None
                if ok and report is not None:
                    rounds += 1
                    sent += len(report.sent)
                    if report.sent and verbosity >= 2:
                        self.log(_("sent %(message_id)s") % {"message_id": ", ".join(report.sent[:20])})
                    if max_rounds is None or rounds < max_rounds:  # none after the last round
                        stop.wait(scheduler.next_round_in())
        if json:
            self.emit_json({"rounds": rounds, "sent": sent})
        self.log(
            _("zeroloss_schedule: stopped after %(rounds)s round(s), %(sent)s tick(s) sent")
            % {"rounds": rounds, "sent": sent}
        )
