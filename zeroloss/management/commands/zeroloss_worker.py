"""``manage.py zeroloss_worker``: process messages straight from the database (no broker).

Exit codes: 0 stopped cleanly (signal, ``--burst``, ``--max-messages``); 1 a worker thread
crashed (a bug: see the log), so a supervisor restarts it; 2 bad arguments; 4 the database
stayed unreachable longer than ``DB_OUTAGE_TOLERANCE`` (by default it never gives up: it
rides out outages and drains again when the database is back). A second SIGTERM/SIGINT exits
at once with 128 + the signal number.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...conf import get_settings
from ...handlers import registered_queues
from ...loops import StopFlag
from ...worker import Worker
from ..base import ZeroLossCommand, positive_float, positive_int

EXIT_CRASHED = 1
EXIT_UNREACHABLE = 4


class Command(ZeroLossCommand):
    help = "Run handlers for messages claimed straight from the ledger. SIGTERM/SIGINT stop it cleanly."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            help="Queue to process (repeatable; default: every registered queue).",
        )
        parser.add_argument("--concurrency", type=positive_int, default=1, help="Worker threads (default 1).")
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=100,
            help="Most messages claimed per round trip (fewer for slow handlers; default 100).",
        )
        parser.add_argument(
            "--poll-interval", type=positive_float, default=0.5, help="Seconds to wait when idle."
        )
        parser.add_argument("--burst", action="store_true", help="Exit once the queues are empty.")
        parser.add_argument(
            "--max-messages",
            type=positive_int,
            help="Exit after handling this many messages (default: no limit).",
        )
        parser.add_argument(
            "--no-sweep", action="store_true", help="Do not run the recovery sweep in this process."
        )
        parser.add_argument(
            "--no-listen",
            action="store_true",
            help="Do not LISTEN for wake-ups (behind a transaction-pooling PgBouncer); poll instead.",
        )
        parser.add_argument(
            "--health-file",
            help="Rewrite this JSON file about every second with the worker's state (for liveness probes).",
        )

    def handle(
        self,
        *,
        queues: list[str] | None,
        concurrency: int,
        batch_size: int,
        poll_interval: float,
        burst: bool,
        max_messages: int | None,
        no_sweep: bool,
        no_listen: bool,
        health_file: str | None,
        json: bool,
        verbosity: int,
        **options: Any,
    ) -> None:
        if verbosity != 1:
            level = {0: logging.ERROR, 2: logging.INFO}.get(verbosity, logging.DEBUG)
            logging.getLogger("zeroloss").setLevel(level)
        service = self.service(options)
        known = registered_queues()
        declared = get_settings().QUEUES
        # A declared queue is one some worker must serve: this one cannot without its handler.
        missing = sorted(q for q in (queues or declared) if q in declared and q not in known)
        if missing:
            raise CommandError(
                f"Queue(s) {', '.join(missing)} declared in ZEROLOSS['QUEUES'] have no handler in this "
                "process: import their handlers here (a zeroloss_handlers module of an installed app), or "
                "run this worker with --queue for the queues it has handlers for; "
                f"registered: {', '.join(known) or 'none'}.",
                returncode=2,
            )
        queues = queues or known
        unknown = sorted(set(queues) - set(known))
        if unknown or not queues:
            raise CommandError(
                f"No handler is registered for queue(s) {', '.join(unknown) or '(none given)'}; "
                f"registered: {', '.join(known) or 'none'}.",
                returncode=2,
            )
        stop = StopFlag()
        worker = Worker(
            queues,
            concurrency=concurrency,
            batch_size=batch_size,
            poll_interval=poll_interval,
            burst=burst,
            max_messages=max_messages,
            sweep=not no_sweep,
            using=service.using,
            stop=stop,
            health_file=health_file,
        )
        if no_listen:
            worker.wakeup.enabled = False
        if verbosity:
            self.log(f"zeroloss_worker: queues {', '.join(queues)}, {concurrency} thread(s)")
        with stop.on_signals():
            stats = worker.run()
        summary = {
            "outcomes": dict(stats.outcomes),
            "sweeps": stats.sweeps,
            "recovered": stats.recovered,
            "stopped_on": stop.signal_name,
        }
        if verbosity:
            self.log(f"zeroloss_worker: stopped{' on ' + stop.signal_name if stop.signal_name else ''}")
        if json:
            self.emit_json(summary)
        elif verbosity:
            self.stdout.write(
                ", ".join(f"{k} {v}" for k, v in sorted(stats.outcomes.items())) or "no messages handled"
            )
        if stats.gave_up:
            raise CommandError(
                "the database stayed unreachable longer than DB_OUTAGE_TOLERANCE", returncode=EXIT_UNREACHABLE
            )
        if stats.crashed:
            raise CommandError("a worker thread crashed; see the log above", returncode=EXIT_CRASHED)
