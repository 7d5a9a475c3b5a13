"""``manage.py zeroloss_purge``: delete old completed (or dead) messages and their audit rows.

Deletes in short batches through :meth:`ZeroLossMessageService.purge_messages`, so no long
lock is held; every batch writes :class:`~zeroloss.models.PurgeRecord` rows counting what it
deleted, which keeps ``zeroloss_verify``'s conservation check exact. Age is measured on the
database clock from ``completed_at`` (completed) or ``dead_at`` (dead).

The run is bounded by what was counted (and confirmed) at its start: messages that become
old enough while it runs are left for the next run.

Exit codes: 0 done (also when nothing matched); 2 bad arguments; 3 not confirmed; 4 the
ledger could not be reached (batches purged before the failure stay purged and counted).
JSON schema: docs/operations.md.

``--verbosity 0`` prints the summary line only; 2 logs every batch on stderr.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import CommandParser
from django.db.models import Count, Exists, OuterRef, Q, Sum
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop, pgettext

from ...core.durations import format_duration
from ...core.states import FINISHED_STATUSES, TRAITS
from ...ledger.models import Message, PurgeRecord, Status
from ...ops.snapshot import invalidate
from ..base import ZeroLossCommand, parse_duration, positive_int


class Command(ZeroLossCommand):
    help = gettext_noop(
        "Delete completed (or dead) messages older than --older-than, in batches, counted for verify."
    )
    changes_data = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=parse_duration,
            required=True,
            metavar="DURATION",
            help=_("Completed/dead for longer than this (90s, 15m, 2h, 7d)."),
        )
        parser.add_argument(
            "--status",
            choices=[s.value for s in FINISHED_STATUSES],
            default=Status.COMPLETED.value,
            help=_("Which messages (default: %(default)s)."),
        )
        parser.add_argument("--queue", help=_("Only this queue (default: every queue)."))
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=1000,
            help=_("Rows per transaction (default: %(default)s)."),
        )
        parser.add_argument(
            "--limit",
            type=positive_int,
            help=_("Purge at most N messages, oldest first (default: no limit)."),
        )

    def handle(
        self,
        *,
        older_than: float,
        status: str,
        queue: str | None,
        batch_size: int,
        limit: int | None,
        dry_run: bool,
        json: bool,
        **options: Any,
    ) -> None:
        service = self.service(options)
        queue = self.check_queue(service, queue)
        stamp = TRAITS[Status(status)].finished_at
        now = service.database_now()
        cutoff = now - dt.timedelta(seconds=older_than)
        matching = Q(status=status, **{f"{stamp}__lt": cutoff})
        if queue is not None:
            matching &= Q(queue_name=queue)
        messages = Message.objects.using(service.using)
        # A workflow's step goes only with its whole workflow, when every step matches.
        holds = messages.filter(workflow_id=OuterRef("workflow_id")).exclude(matching)
        qs = messages.filter(matching).exclude(~Q(workflow_id="") & Exists(holds))
        by_queue = {
            row["queue_name"]: row["n"] for row in qs.order_by().values("queue_name").annotate(n=Count("id"))
        }
        available = sum(by_queue.values())
        matched = available if limit is None else min(available, limit)
        result: dict[str, Any] = {
            "dry_run": dry_run,
            "status": status,
            "queue": queue,
            "older_than_seconds": older_than,
            "cutoff": cutoff.isoformat(),
            "limit": limit,
            "batch_size": batch_size,
            "matched": matched,
            "purged": 0,
            "by_queue": by_queue if limit is None or dry_run else {},
        }
        if dry_run or matched == 0:
            if limit is not None and dry_run:
                result["by_queue"] = self.first_by_queue(qs, stamp, matched)
            self.report(result, as_json=json)
            return
        question = (
            _(
                "Purge %(count)s %(status)s message(s) of queue %(queue)s older than %(age)s, with their audit rows?"
            )
            if queue
            else _("Purge %(count)s %(status)s message(s) older than %(age)s, with their audit rows?")
        )
        self.confirm(
            question
            % {"count": matched, "status": status, "queue": repr(queue), "age": format_duration(older_than)},
            {**options, "json": json},
        )
        actor = self.actor()
        purged = 0
        bar = self.progress(matched, pgettext("a progress bar's label", "purge"), {**options, "json": json})
        try:
            while purged < matched:
                # The service measures the age again on the database clock at each batch; the
                # total stays within what was confirmed.
                n = service.purge_messages(
                    status=status,
                    older_than=older_than,
                    queue_name=queue,
                    batch_size=batch_size,
                    actor=actor,
                    limit=min(batch_size, matched - purged),
                )
                if n == 0:
                    break
                purged += n
                bar.advance(n)
                self.log(
                    _("zeroloss_purge: batch of %(n)s purged (%(purged)s/%(matched)s)")
                    % {"n": n, "purged": purged, "matched": matched},
                    level=2,
                )
        finally:
            bar.close()
        invalidate(service)
        result["purged"] = purged
        result["by_queue"] = {
            row["queue_name"]: row["n"]
            for row in PurgeRecord.objects.using(service.using)
            .filter(actor=actor)
            .order_by()
            .values("queue_name")
            .annotate(n=Sum("count"))
        }
        self.report(result, as_json=json)

    @staticmethod
    def first_by_queue(qs: Any, stamp: str, n: int) -> dict[str, int]:
        counts: dict[str, int] = {}
        for queue in qs.order_by(stamp, "id").values_list("queue_name", flat=True)[:n]:
            counts[queue] = counts.get(queue, 0) + 1
        return counts

    def report(self, result: dict[str, Any], *, as_json: bool) -> None:
        if as_json:
            self.emit_json(result)
            return
        values = {
            "status": result["status"],
            "age": format_duration(result["older_than_seconds"]),
            "cutoff": result["cutoff"],
        }
        if result["dry_run"]:
            line = _("would purge %(count)s %(status)s message(s) older than %(age)s (before %(cutoff)s)")
            values["count"] = result["matched"]
        else:
            line = _("purged %(count)s %(status)s message(s) older than %(age)s (before %(cutoff)s)")
            values["count"] = result["purged"]
        self.stdout.write(line % values)
        if result["by_queue"] and self.verbosity >= 1:
            self.table([_("queue"), _("messages")], sorted(result["by_queue"].items()))
