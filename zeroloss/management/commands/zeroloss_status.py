"""``manage.py zeroloss_status``: messages per queue x status, stuck, dead, nodes, replication,
blocked ordering keys. ``--workflow ID``: one workflow's steps instead (by level, with status,
attempts, result or last error, what each waits for, and the dead steps that block it).

Reads only, from the snapshot cache (``CACHE_TIMEOUT``) unless ``--no-cache``. ``--watch
SECONDS`` reads the database at every refresh until Ctrl-C/SIGTERM (or ``--count``
refreshes); with ``--json`` it then prints one JSON document per line.

``--verbosity 0`` prints the queue table only; 2 adds how the snapshot was read (fresh or
cached, how long it took, whether completed counts are estimated).

Exit codes: 0 done; 2 bad arguments (unknown queue, workflow or database alias, malformed number);
4 the ledger could not be reached; 141 stdout was closed (``--watch ... | head -1``).
JSON schema: docs/operations.md.
"""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from ...ledger.models import Status
from ...ledger.service import ZeroLossMessageService
from ...ops.health import storage_fault
from ...ops.snapshot import format_duration, get_snapshot
from ...ops.snapshot_types import Snapshot
from ...runtime.sweep_loop import StopFlag
from ..base import ZeroLossCommand, positive_float, positive_int
from ..workflows import read_report, show_workflow

#: Blocked keys listed in the text output (``--json`` has up to ``snapshot.MAX_BLOCKED_KEYS``).
SHOWN_BLOCKED_KEYS = 10


class Command(ZeroLossCommand):
    help = gettext_noop(
        "Show messages per queue and status, the oldest waiting message, stuck (expired leases) and "
        "dead messages, live/down replication nodes, whether the replication requirement is met, and "
        "ordering keys blocked by their head."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue", help=_("Only this queue (it must have messages in the ledger; default: every queue).")
        )
        parser.add_argument(
            "--workflow",
            metavar="ID",
            help=_(
                "Show this workflow's steps instead: by level, with status, attempts, result or last "
                "error, what each waits for, and the dead steps that block it."
            ),
        )
        parser.add_argument(
            "--watch",
            type=positive_float,
            metavar="SECONDS",
            help=_("Refresh every SECONDS until stopped (default: print once)."),
        )
        parser.add_argument(
            "--count",
            type=positive_int,
            help=_("With --watch: stop after this many refreshes (default: until stopped)."),
        )
        parser.add_argument(
            "--no-cache",
            action="store_true",
            help=_("Read the database now instead of a snapshot up to CACHE_TIMEOUT seconds old."),
        )

    def handle(
        self,
        *,
        queue: str | None,
        workflow: str | None,
        watch: float | None,
        count: int | None,
        no_cache: bool,
        json: bool,
        **options: Any,
    ) -> None:
        if count is not None and watch is None:
            self.usage_error(_("--count needs --watch"))
        if workflow is not None and queue is not None:
            self.usage_error(_("--workflow shows one workflow: leave out --queue"))
        service = self.service(options)
        queue = self.check_queue(service, queue)
        if workflow is not None and watch is None:
            # A workflow's steps are read from the database (never cached).
            show_workflow(self, read_report(self, service, workflow), as_json=json, compact=False)
            return
        if watch is None:
            self.show(service, queue, use_cache=not no_cache, as_json=json, compact=False)
            return
        stop = StopFlag()
        shown = 0
        with stop.on_signals():
            while not stop:
                # Watching asks for fresh numbers: every refresh reads the database (and refreshes
                # the cached snapshot other readers get).
                if workflow is not None:
                    show_workflow(self, read_report(self, service, workflow), as_json=json, compact=True)
                else:
                    self.show(service, queue, use_cache=False, as_json=json, compact=True)
                shown += 1
                if count is not None and shown >= count:
                    break
                stop.wait(watch)

    def show(
        self,
        service: ZeroLossMessageService,
        queue: str | None,
        *,
        use_cache: bool,
        as_json: bool,
        compact: bool,
    ) -> None:
        began = time.perf_counter()
        snapshot: Snapshot = get_snapshot(service, use_cache=use_cache)
        elapsed = time.perf_counter() - began
        if queue is not None:
            snapshot = snapshot.for_queue(queue)
        data = snapshot.as_dict()
        # Never cached: a full disk matters now, not as of the last snapshot.
        data["storage"] = storage_fault(service.using) or None
        if as_json:
            if compact:
                self.stdout.write(json.dumps(data, sort_keys=True, default=str))
            else:
                self.emit_json(data)
            self.stdout.flush()
            return
        if compact:
            self.stdout.write("")
        statuses = Status.values
        completed = Status.COMPLETED.value + ("~" if data["completed_estimated"] else "")
        headers = [completed if s == Status.COMPLETED else s for s in statuses]
        rows = [
            [
                q["name"],
                *(q["counts"][s] for s in statuses),
                q["stuck"],
                format_duration(q["oldest_pending_age"]),
            ]
            for q in data["queues"]
        ]
        if len(rows) != 1:
            totals = data["totals"]
            rows.append(
                [
                    _("(all)"),
                    *(totals[s] for s in statuses),
                    data["stuck"],
                    format_duration(data["oldest_pending_age"]),
                ]
            )
        # The status columns are the status codes (as --json has them); the others are words.
        self.table([_("queue"), *headers, _("stuck"), _("oldest pending")], rows)
        if self.verbosity >= 1:
            self.footer(data)
        if self.verbosity >= 2:
            where = _("from the cache") if data["cached"] else _("read from the database")
            counts = (
                _("estimated from PostgreSQL's statistics") if data["completed_estimated"] else _("exact")
            )
            self.stdout.write(
                _("snapshot: %(where)s in %(ms)s ms; completed counts %(counts)s")
                % {"where": where, "ms": f"{elapsed * 1000:.1f}", "counts": counts}
            )
        self.stdout.flush()

    def footer(self, data: dict[str, Any]) -> None:
        if data["completed_estimated"]:
            self.stdout.write(
                _("completed~: estimated from PostgreSQL's statistics (other columns are exact)")
            )
        rep = data["replication"]
        self.stdout.write("")
        if data["storage"]:
            self.stdout.write(_("STORAGE FAULT: %(what)s") % {"what": data["storage"]})
        self.stdout.write(
            _("nodes: %(live)s live, %(down)s down")
            % {"live": data["nodes"]["live"], "down": data["nodes"]["down"]}
        )
        self.stdout.write(
            _("replication: %(met)s (%(available)s streaming standby(s), %(required)s required)")
            % {
                "met": _("met") if rep["ok"] else _("NOT MET"),
                "available": rep["available"],
                "required": rep["required"],
            }
        )
        for problem in rep["problems"]:
            self.stdout.write(f"  - {problem}")
        self.blocked_keys(data)
        self.controls(data)
        parts = data["partitions"]
        if parts["partitioned"]:
            self.stdout.write(
                _("partitions: sends have one until %(until)s")
                % {"until": parts["covered_until"] or _("NONE COVERS NOW")}
            )
        self.overdue_schedules(data)
        sweep = data["sweep"]
        self.stdout.write(
            _("sweep (audit trail): %(requeued)s requeued, %(dead)s dead-lettered in %(runs)s run(s)")
            % {"requeued": sweep["requeued"], "dead": sweep["dead_lettered"], "runs": sweep["runs"]}
        )
        self.stdout.write(
            (
                _("as of %(taken_at)s (database clock) from cache")
                if data["cached"]
                else _("as of %(taken_at)s (database clock)")
            )
            % {"taken_at": data["taken_at"]}
        )

    def controls(self, data: dict[str, Any]) -> None:
        """Paused and limited queues (docs/control.md), one line each; nothing when there are none."""
        for q in data["queues"]:
            parts = [_("paused")] if q.get("paused") else []
            if q.get("concurrency") is not None:
                parts.append(_("concurrency %(n)s") % {"n": q["concurrency"]})
            if q.get("rate"):
                parts.append(_("rate %(rate)s") % {"rate": q["rate"]})
            if parts:
                self.stdout.write(
                    _("queue %(queue)s: %(control)s") % {"queue": q["name"], "control": ", ".join(parts)}
                )

    def overdue_schedules(self, data: dict[str, Any]) -> None:
        """Schedules whose tick is overdue (no scheduler running), one line each; nothing when none."""
        overdue = data.get("overdue_schedules", [])
        if not overdue:
            return
        self.stdout.write(
            _(
                "OVERDUE SCHEDULES: %(count)s, no scheduler is sending their ticks (run zeroloss_worker, "
                "zeroloss_schedule --loop, or beat with beat_schedule_entry())"
            )
            % {"count": len(overdue)}
        )
        for o in overdue:
            self.stdout.write(
                _("  - %(name)s: tick %(due)s not sent, %(late)s late")
                % {"name": o["name"], "due": o["due"], "late": format_duration(o["late"])}
                + ("" if o["seen"] else " " + _("(never loaded by a scheduler)"))
            )

    def blocked_keys(self, data: dict[str, Any]) -> None:
        keys = data["blocked_keys"]
        more = "+" if data["blocked_keys_truncated"] else ""
        self.stdout.write(_("blocked ordering keys: %(count)s") % {"count": f"{len(keys)}{more}"})
        if not keys:
            return
        rows = [
            [
                k["queue"],
                k["key"],
                k["head_message_id"] or "-",
                k["why"],
                format_duration(k["blocked_for"]),
                k["behind"],
                k["detail"] if len(k["detail"]) <= 80 else k["detail"][:79] + "…",
            ]
            for k in keys[:SHOWN_BLOCKED_KEYS]
        ]
        self.table([_("queue"), _("key"), _("head"), _("why"), _("for"), _("behind"), _("detail")], rows)
        if len(keys) > SHOWN_BLOCKED_KEYS:
            self.stdout.write(
                _("  ... %(count)s more (--json lists up to 100)")
                % {"count": f"{len(keys) - SHOWN_BLOCKED_KEYS}{more}"}
            )
