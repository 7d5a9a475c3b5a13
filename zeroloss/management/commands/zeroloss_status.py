"""``manage.py zeroloss_status``: messages per queue x status, stuck, dead, nodes, replication.

Reads only, from the snapshot cache (``CACHE_TIMEOUT``) unless ``--no-cache``. ``--watch
SECONDS`` reads the database at every refresh until Ctrl-C/SIGTERM (or ``--count``
refreshes); with ``--json`` it then prints one JSON document per line.

Exit codes: 0 done; 2 bad arguments (unknown queue or database alias, malformed number).
JSON schema: docs/operations.md.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from ...loops import StopFlag
from ...snapshot import STATUSES, Snapshot, get_snapshot
from ..base import ZeroLossCommand, format_duration, positive_float, positive_int


class Command(ZeroLossCommand):
    help = (
        "Show messages per queue and status, the oldest waiting message, stuck (expired leases) and "
        "dead messages, live/down replication nodes and whether the replication requirement is met."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", help="Only this queue (it must have messages in the ledger).")
        parser.add_argument(
            "--watch", type=positive_float, metavar="SECONDS", help="Refresh every SECONDS until stopped."
        )
        parser.add_argument(
            "--count", type=positive_int, help="With --watch: stop after this many refreshes."
        )
        parser.add_argument(
            "--no-cache",
            action="store_true",
            help="Read the database now instead of a snapshot up to CACHE_TIMEOUT seconds old.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["count"] is not None and options["watch"] is None:
            self.usage_error("--count needs --watch")
        service = self.service(options)
        queue = self.check_queue(service, options["queue"])
        use_cache = not options["no_cache"]
        if options["watch"] is None:
            self.show(get_snapshot(service, use_cache=use_cache), queue, options, compact=False)
            return
        # Watching asks for fresh numbers: every refresh reads the database (and refreshes
        # the cached snapshot other readers get).
        use_cache = False
        stop = StopFlag()
        shown = 0
        with stop.on_signals():
            while not stop:
                self.show(get_snapshot(service, use_cache=use_cache), queue, options, compact=True)
                shown += 1
                if options["count"] is not None and shown >= options["count"]:
                    break
                stop.wait(options["watch"])

    def show(self, snapshot: Snapshot, queue: str | None, options: dict[str, Any], *, compact: bool) -> None:
        if queue is not None:
            snapshot = snapshot.for_queue(queue)
        data = snapshot.as_dict()
        if options["json"]:
            if compact:
                self.stdout.write(json.dumps(data, sort_keys=True, default=str))
            else:
                self.emit_json(data)
            self.stdout.flush()
            return
        if compact:
            self.stdout.write("")
        rows = []
        for q in data["queues"]:
            rows.append(
                [
                    q["name"],
                    *(q["counts"][s] for s in STATUSES),
                    q["stuck"],
                    format_duration(q["oldest_pending_age"]),
                ]
            )
        if len(rows) != 1:
            totals = data["totals"]
            rows.append(
                [
                    "(all)",
                    *(totals[s] for s in STATUSES),
                    data["stuck"],
                    format_duration(data["oldest_pending_age"]),
                ]
            )
        self.table(["queue", *STATUSES, "stuck", "oldest pending"], rows)
        rep = data["replication"]
        self.stdout.write("")
        self.stdout.write(f"nodes: {data['nodes']['live']} live, {data['nodes']['down']} down")
        self.stdout.write(
            f"replication: {'met' if rep['ok'] else 'NOT MET'} "
            f"({rep['available']} streaming standby(s), {rep['required']} required)"
        )
        for problem in rep["problems"]:
            self.stdout.write(f"  - {problem}")
        sweep = data["sweep"]
        self.stdout.write(
            f"sweep (audit trail): {sweep['requeued']} requeued, {sweep['dead_lettered']} dead-lettered "
            f"in {sweep['runs']} run(s)"
        )
        self.stdout.write(
            f"as of {data['taken_at']} (database clock){' from cache' if data['cached'] else ''}"
        )
        self.stdout.flush()
