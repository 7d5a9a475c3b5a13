"""``manage.py zeroloss_sweep``: requeue (or dead-letter) messages whose lease expired.

Exit codes: 0 done; 2 bad arguments; 4 the database could not be reached (once), or stayed
unreachable longer than ``DB_OUTAGE_TOLERANCE`` (``--loop``; by default a looping sweeper
rides out outages: one log line, backoff, reconnect).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from ...core.durations import format_duration
from ...core.outage import OutageTooLong
from ...ledger.types import RecoveryReport
from ...runtime import retention
from ...runtime.sweep_loop import StopFlag, SweepLoop
from ...runtime.transports import after_sweep_hooks
from ...runtime.worker.sessions import harden_sessions
from ..base import ZeroLossCommand, positive_float, positive_int

EXIT_UNREACHABLE = 4


class Command(ZeroLossCommand):
    help = gettext_noop(
        "Run the recovery sweep once, or in a loop with --loop (stops cleanly on SIGTERM/SIGINT)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--loop", action="store_true", help=_("Keep sweeping every --interval seconds."))
        parser.add_argument(
            "--interval", type=positive_float, help=_("Seconds between sweeps (default SWEEP_INTERVAL).")
        )
        parser.add_argument(
            "--batch-size", type=positive_int, help=_("Rows per transaction (default SWEEP_BATCH_SIZE).")
        )
        parser.add_argument(
            "--max-runs",
            type=positive_int,
            help=_("With --loop: stop after this many sweeps (default: no limit)."),
        )

    def handle(
        self,
        *,
        loop: bool,
        interval: float | None,
        batch_size: int | None,
        max_runs: int | None,
        json: bool,
        verbosity: int,
        **options: Any,
    ) -> None:
        service = self.service(options)
        if loop:
            harden_sessions([service.using], service.settings.DEAD_PEER_TIMEOUT)
        stop = StopFlag()
        requeued: list[str] = []
        dead_lettered: list[str] = []

        def report(r: RecoveryReport) -> None:
            requeued.extend(r.requeued)
            dead_lettered.extend(r.dead_lettered)
            if verbosity and not json and (r.total or not loop):
                line = _("requeued %(requeued)s, dead-lettered %(dead)s") % {
                    "requeued": len(r.requeued),
                    "dead": len(r.dead_lettered),
                }
                if r.requeued:
                    line += _(": requeued %(ids)s") % {"ids": ", ".join(r.requeued[:20])}
                if r.dead_lettered:
                    line += _("; dead %(ids)s") % {"ids": ", ".join(r.dead_lettered[:20])}
                self.stdout.write(line)

        sweeper = SweepLoop(
            service,
            interval=interval,
            batch_size=batch_size,
            stop=stop,
            on_report=report,
            after_sweep=after_sweep_hooks(service),
        )
        if loop:
            with stop.on_signals():
                if verbosity:
                    self.log(
                        _("zeroloss_sweep: sweeping every %(interval)s (Ctrl-C or SIGTERM stops)")
                        % {"interval": format_duration(sweeper.interval)}
                    )
                try:
                    sweeper.run(max_runs=max_runs)
                except OutageTooLong as exc:
                    raise CommandError(str(exc), returncode=EXIT_UNREACHABLE) from None
            if verbosity:
                values = {"runs": sweeper.runs, "signal": stop.signal_name}
                self.log(
                    _("zeroloss_sweep: stopped after %(runs)s sweep(s) on %(signal)s") % values
                    if stop.signal_name
                    else _("zeroloss_sweep: stopped after %(runs)s sweep(s)") % values
                )
        else:
            sweeper.run_once()
            # A retention turn this sweep took runs in a thread: done before the process exits.
            retention.join(service.using)
        if json:
            self.emit_json({"runs": sweeper.runs, "requeued": requeued, "dead_lettered": dead_lettered})
