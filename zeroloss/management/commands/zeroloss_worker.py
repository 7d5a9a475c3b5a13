"""``manage.py zeroloss_worker``: process messages straight from the database (no broker).

Exit codes: 0 stopped cleanly (signal, ``--burst``, ``--max-messages``); 1 a worker thread
crashed (e.g. the database went away), so a supervisor restarts it; 2 bad arguments.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...handlers import registered_queues
from ...loops import StopFlag
from ...worker import Worker
from ..base import ZeroLossCommand, positive_float, positive_int


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
            "--batch-size", type=positive_int, default=10, help="Messages claimed per round trip."
        )
        parser.add_argument(
            "--poll-interval", type=positive_float, default=0.5, help="Seconds to wait when idle."
        )
        parser.add_argument("--burst", action="store_true", help="Exit once the queues are empty.")
        parser.add_argument(
            "--max-messages", type=positive_int, help="Exit after handling this many messages."
        )
        parser.add_argument(
            "--no-sweep", action="store_true", help="Do not run the recovery sweep in this process."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        service = self.service(options)
        known = registered_queues()
        queues = options["queues"] or known
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
            concurrency=options["concurrency"],
            batch_size=options["batch_size"],
            poll_interval=options["poll_interval"],
            burst=options["burst"],
            max_messages=options["max_messages"],
            sweep=not options["no_sweep"],
            using=service.using,
            stop=stop,
        )
        self.log(f"zeroloss_worker: queues {', '.join(queues)}, {options['concurrency']} thread(s)")
        with stop.on_signals():
            stats = worker.run()
        summary = {"outcomes": dict(stats.outcomes), "sweeps": stats.sweeps, "recovered": stats.recovered}
        self.log(f"zeroloss_worker: stopped{' on ' + stop.signal_name if stop.signal_name else ''}")
        if options["json"]:
            self.emit_json(summary)
        else:
            self.stdout.write(
                ", ".join(f"{k} {v}" for k, v in sorted(stats.outcomes.items())) or "no messages handled"
            )
        if stats.crashed:
            raise CommandError("a worker thread crashed; see the log above", returncode=1)
