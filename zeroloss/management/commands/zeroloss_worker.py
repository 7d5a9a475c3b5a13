"""``manage.py zeroloss_worker``: process messages straight from the database (no broker).

Exit codes: 0 stopped cleanly (signal, ``--burst``, ``--max-messages``); 1 a part whose policy
is to end the worker died (a bug: see the log; :data:`zeroloss.runtime.worker.supervisor.PARTS`), so the
process manager restarts it; 2 bad arguments; 4 the database
stayed unreachable longer than ``DB_OUTAGE_TOLERANCE`` (by default it never gives up: it
rides out outages and drains again when the database is back). A second SIGTERM/SIGINT exits
at once with 128 + the signal number.

``--pool process`` runs the handlers in child processes, one per thread (``--concurrency``),
replaced after ``--max-tasks-per-child`` messages, killed and replaced at a handler's hard
``time_limit`` (docs/control.md); transactional handlers are refused with it
(exit code 2).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from ...core.settings import get_settings
from ...ops.logs import command_logging
from ...runtime.handlers import get_handler, registered_queues
from ...runtime.sweep_loop import StopFlag
from ...runtime.worker import Worker
from ...runtime.worker.pool import refuse_transactional
from ...runtime.worker.supervisor import METRICS
from ...testing import refuse_inside_a_transaction
from ..base import LedgerUnreachable, ZeroLossCommand, positive_float, positive_int

EXIT_CRASHED = 1
EXIT_UNREACHABLE = 4


class Command(ZeroLossCommand):
    help = gettext_noop(
        "Run handlers for messages claimed straight from the ledger. SIGTERM/SIGINT stop it cleanly."
    )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # No default: the queues' own database (QUEUE_DATABASES) unless one is named.
        for action in parser._actions:
            if action.dest == "database":
                action.default = None
                action.help = _(
                    "Database alias: the one QUEUE_DATABASES routes the queues to (default), or "
                    "the database whose registered queues to process when no --queue is given."
                )
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            help=_(
                "Queue to process (repeatable; default: every registered queue whose ledger is the "
                "--database, default if none). One process works on one database."
            ),
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=1,
            help=_("Worker threads (default 1); with --pool process, one child process each."),
        )
        parser.add_argument(
            "--pool",
            choices=["thread", "process"],
            default="thread",
            help=_(
                "Where handlers run: 'thread' (default) on the claim threads, or 'process' in child "
                "processes, which a hard time_limit can stop."
            ),
        )
        parser.add_argument(
            "--max-tasks-per-child",
            type=positive_int,
            help=_("With --pool process: replace a child after this many messages (default: never)."),
        )
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=100,
            help=_("Most messages claimed per round trip (fewer for slow handlers; default 100)."),
        )
        parser.add_argument(
            "--poll-interval", type=positive_float, default=0.5, help=_("Seconds to wait when idle.")
        )
        parser.add_argument("--burst", action="store_true", help=_("Exit once the queues are empty."))
        parser.add_argument(
            "--max-messages",
            type=positive_int,
            help=_("Exit after handling this many messages (default: no limit)."),
        )
        parser.add_argument(
            "--no-sweep", action="store_true", help=_("Do not run the recovery sweep in this process.")
        )
        parser.add_argument(
            "--no-schedule",
            action="store_true",
            help=_(
                "Do not run the scheduler (ZEROLOSS['SCHEDULES'] and database schedules) in this process."
            ),
        )
        parser.add_argument(
            "--no-listen",
            action="store_true",
            help=_("Do not LISTEN for wake-ups (behind a transaction-pooling PgBouncer); poll instead."),
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            help=_(
                "Serve this worker's event metrics for Prometheus on this port (all processes' "
                "under PROMETHEUS_MULTIPROC_DIR); needs prometheus_client (zeroloss[metrics])."
            ),
        )
        parser.add_argument(
            "--metrics-addr",
            default="127.0.0.1",
            help=_("The address --metrics-port listens on (default 127.0.0.1)."),
        )
        parser.add_argument(
            "--health-file",
            help=_(
                "Rewrite this JSON file about every second with the worker's state (for liveness probes)."
            ),
        )

    def handle(
        self,
        *,
        queues: list[str] | None,
        concurrency: int,
        pool: str,
        max_tasks_per_child: int | None,
        metrics_port: int | None,
        metrics_addr: str,
        **options: Any,
    ) -> None:
        known = registered_queues()
        declared = get_settings().QUEUES
        # A declared queue is one some worker must serve: this one cannot without its handler.
        missing = sorted(q for q in (queues or declared) if q in declared and q not in known)
        if missing:
            raise CommandError(
                _(
                    "Queue(s) %(missing)s declared in ZEROLOSS['QUEUES'] have no handler in this "
                    "process: import their handlers here (a zeroloss_handlers module of an installed app), or "
                    "run this worker with --queue for the queues it has handlers for; "
                    "registered: %(registered)s."
                )
                % {"missing": ", ".join(missing), "registered": ", ".join(known) or _("none")},
                returncode=2,
            )
        unknown = sorted(set(queues or ()) - set(known))
        if unknown or not known:
            raise CommandError(
                _("No handler is registered for queue(s) %(unknown)s; registered: %(registered)s.")
                % {
                    "unknown": ", ".join(unknown) or _("(none given)"),
                    "registered": ", ".join(known) or _("none"),
                },
                returncode=2,
            )
        with self._metrics_served(metrics_port, metrics_addr) as metrics_thread:
            options["metrics_thread"] = metrics_thread
            self._run_worker(queues, known, concurrency, pool, max_tasks_per_child, options)

    @staticmethod
    @contextlib.contextmanager
    def _metrics_served(port: int | None, addr: str) -> Iterator[threading.Thread | None]:
        """The event metrics over HTTP while the worker runs, served before any message runs
        (a bad port fails at once); nothing without ``--metrics-port``. Yields the server's thread."""
        if port is None:
            yield None
            return
        if not 0 < port < 65536:
            raise CommandError(
                _("--metrics-port must be 1-65535, got %(port)s.") % {"port": port}, returncode=2
            )
        try:
            # deferred: prometheus-client is optional (zeroloss[metrics])
            from prometheus_client import CollectorRegistry, start_http_server

            from ...integrations.telemetry.prometheus import EventsCollector  # deferred: the same

        except ImportError:
            raise CommandError(
                _("--metrics-port needs prometheus_client: pip install 'zeroloss[metrics]'."), returncode=2
            ) from None
        registry = CollectorRegistry(auto_describe=True)
        registry.register(EventsCollector())
        try:
            server, thread = start_http_server(port, addr=addr, registry=registry)
        except OSError as exc:
            raise CommandError(
                _("--metrics-port %(port)s on %(addr)s: %(error)s")
                % {"port": port, "addr": addr, "error": exc},
                returncode=2,
            ) from exc
        try:
            yield thread
        finally:
            server.shutdown()
            server.server_close()

    def _run_worker(
        self,
        queues: list[str] | None,
        known: list[str],
        concurrency: int,
        pool: str,
        max_tasks_per_child: int | None,
        options: dict[str, Any],
    ) -> None:
        batch_size, poll_interval, burst = options["batch_size"], options["poll_interval"], options["burst"]
        max_messages, health_file = options["max_messages"], options["health_file"]
        no_sweep, no_schedule, no_listen = options["no_sweep"], options["no_schedule"], options["no_listen"]
        json, verbosity = options["json"], options["verbosity"]
        if options["database"] is not None:
            self.service(options)  # an unknown alias is a usage error before anything else
        options["database"], queues = self._database_and_queues(options["database"], queues, known)
        self._database = options["database"]
        service = self.service(options)
        refuse_inside_a_transaction(service.using)
        if max_tasks_per_child is not None and pool != "process":
            raise CommandError(_("--max-tasks-per-child needs --pool process."), returncode=2)
        if pool == "process":
            try:
                refuse_transactional([get_handler(q) for q in queues])
            except ValueError as exc:
                raise CommandError(str(exc), returncode=2) from None
        stop = StopFlag()
        worker = Worker(
            queues,
            concurrency=concurrency,
            batch_size=batch_size,
            poll_interval=poll_interval,
            burst=burst,
            max_messages=max_messages,
            sweep=not no_sweep,
            schedule=not no_schedule,
            using=service.using,
            stop=stop,
            health_file=health_file,
            pool=pool,
            max_tasks_per_child=max_tasks_per_child,
        )
        if no_listen:
            worker.wakeup.enabled = False
        if options["metrics_thread"] is not None:
            worker.supervisor.watch(METRICS, options["metrics_thread"])
        if verbosity:
            self.log(
                _("zeroloss_worker: queues %(queues)s on database %(alias)s, %(threads)s thread(s)")
                % {"queues": ", ".join(queues), "alias": repr(service.using), "threads": concurrency}
                + (_(", a child process each") if pool == "process" else "")
            )
        # Handler failures, dead letters, recoveries and outages on stderr, as -v asks.
        with stop.on_signals(), command_logging(verbosity, self.stderr):
            stats = worker.run()
        summary = {
            "outcomes": dict(stats.outcomes),
            "sweeps": stats.sweeps,
            "recovered": stats.recovered,
            "stopped_on": stop.signal_name,
            "exit_part": stats.exit_part,
        }
        if verbosity:
            self.log(
                _("zeroloss_worker: stopped on %(signal)s") % {"signal": stop.signal_name}
                if stop.signal_name
                else _("zeroloss_worker: stopped")
            )
        if json:
            self.emit_json(summary)
        elif verbosity:
            self.stdout.write(
                ", ".join(f"{k} {v}" for k, v in sorted(stats.outcomes.items())) or _("no messages handled")
            )
        if stats.gave_up:
            raise CommandError(
                _("the database stayed unreachable longer than DB_OUTAGE_TOLERANCE"),
                returncode=EXIT_UNREACHABLE,
            )
        if stats.crashed:
            raise CommandError(
                _("the worker's %(part)s died (its policy: exit); see the log above")
                % {"part": stats.exit_part or _("thread")},
                returncode=EXIT_CRASHED,
            )

    def unreachable(self, exc: Exception, options: dict[str, Any]) -> LedgerUnreachable:
        # The database the worker polled, which the routing chose (options has what was typed).
        polled = getattr(self, "_database", None) or options.get("database")
        return super().unreachable(exc, {**options, "database": polled})

    @staticmethod
    def _database_and_queues(
        database: str | None, queues: list[str] | None, known: list[str]
    ) -> tuple[str, list[str]]:
        """The one database this worker polls, and its queues (exit code 2 when they disagree).

        A worker claims from one ledger database; each queue's is the one ``QUEUE_DATABASES``
        routes it to, ``default`` otherwise.
        """
        routes = get_settings().QUEUE_DATABASES
        if not queues:
            alias = database or DEFAULT_DB_ALIAS
            mine = [q for q in known if routes.get(q, DEFAULT_DB_ALIAS) == alias]
            if not mine:
                raise CommandError(
                    _(
                        "No registered queue's ledger is database %(alias)s (QUEUE_DATABASES: "
                        "%(routes)s; every other queue's is 'default'); name the queues with --queue."
                    )
                    % {"alias": repr(alias), "routes": repr(dict(routes))},
                    returncode=2,
                )
            return alias, mine
        where = {q: routes.get(q, DEFAULT_DB_ALIAS) for q in queues}
        databases = sorted(set(where.values()))
        if len(databases) > 1:
            raise CommandError(
                _(
                    "These queues live in different databases (QUEUE_DATABASES): %(where)s; one worker "
                    "process claims from one database: run one zeroloss_worker per database (%(commands)s)."
                )
                % {
                    "where": ", ".join(f"{q!r} ({db})" for q, db in where.items()),
                    "commands": "; ".join(
                        f"--database {db} " + " ".join(f"--queue {q}" for q in where if where[q] == db)
                        for db in databases
                    ),
                },
                returncode=2,
            )
        [routed] = databases
        if database is not None and database != routed:
            raise CommandError(
                _(
                    "Queue(s) %(queues)s live in database %(routed)s (QUEUE_DATABASES), not %(database)s: "
                    "a worker there would find none of their messages. Run it with --database %(alias)s "
                    "(or without --database)."
                )
                % {
                    "queues": ", ".join(repr(q) for q in queues),
                    "routed": repr(routed),
                    "database": repr(database),
                    "alias": routed,
                },
                returncode=2,
            )
        return routed, list(dict.fromkeys(queues))
