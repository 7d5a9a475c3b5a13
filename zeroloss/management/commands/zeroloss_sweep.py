"""``manage.py zeroloss_sweep``: requeue (or dead-letter) messages whose lease expired.

Exit codes: 0 done; 2 bad arguments; 4 the database could not be reached (once), or stayed
unreachable longer than ``DB_OUTAGE_TOLERANCE`` (``--loop``; by default a looping sweeper
rides out outages: one log line, backoff, reconnect).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...durations import format_duration
from ...ledger.types import RecoveryReport
from ...loops import StopFlag, SweepLoop
from ...outage import OutageTooLong
from ...transports import after_sweep_hooks
from ...worker.sessions import harden_sessions
from ..base import ZeroLossCommand, positive_float, positive_int

EXIT_UNREACHABLE = 4


class Command(ZeroLossCommand):
    help = "Run the recovery sweep once, or in a loop with --loop (stops cleanly on SIGTERM/SIGINT)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--loop", action="store_true", help="Keep sweeping every --interval seconds.")
        parser.add_argument(
            "--interval", type=positive_float, help="Seconds between sweeps (default SWEEP_INTERVAL)."
        )
        parser.add_argument(
            "--batch-size", type=positive_int, help="Rows per transaction (default SWEEP_BATCH_SIZE)."
        )
        parser.add_argument(
            "--max-runs",
            type=positive_int,
            help="With --loop: stop after this many sweeps (default: no limit).",
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
                self.stdout.write(
                    f"requeued {len(r.requeued)}, dead-lettered {len(r.dead_lettered)}"
                    + (f": requeued {', '.join(r.requeued[:20])}" if r.requeued else "")
                    + (f"; dead {', '.join(r.dead_lettered[:20])}" if r.dead_lettered else "")
                )

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
                        f"zeroloss_sweep: sweeping every {format_duration(sweeper.interval)} (Ctrl-C or SIGTERM stops)"
                    )
                try:
                    sweeper.run(max_runs=max_runs)
                except OutageTooLong as exc:
                    raise CommandError(str(exc), returncode=EXIT_UNREACHABLE) from None
            if verbosity:
                self.log(
                    f"zeroloss_sweep: stopped after {sweeper.runs} sweep(s)"
                    f"{' on ' + stop.signal_name if stop.signal_name else ''}"
                )
        else:
            sweeper.run_once()
        if json:
            self.emit_json({"runs": sweeper.runs, "requeued": requeued, "dead_lettered": dead_lettered})
