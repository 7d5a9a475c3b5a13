"""``manage.py zeroloss_partition show|convert``: the ledger's partitions (docs/scaling.md).

- ``show``: the layout (``partitioned``, ``unpartitioned``, or ``converting``: a conversion was
  started and has not finished), each period's partition with its bounds and its messages (the
  planner's estimate), and until when sends have a partition to go to.
- ``convert``: convert a populated unpartitioned ledger (one migrated from 0.2) to the
  partitioned layout, online: workers and producers go on, no step holds a lock that blocks
  them for longer than a second, and a conversion cut off (a deploy, a SIGKILL, a lock it could
  not get) resumes where it stopped when run again (:mod:`zeroloss.ledger.conversion`).
  ``--dry-run`` says what it would do.

Exit codes: 0 done (or nothing to do); 1 the copy and the table differ (nothing swapped: run it
again); 2 bad arguments, or a ledger that cannot be partitioned (SQLite); 3 not confirmed;
4 the ledger could not be reached, or a lock could not be had in a minute of tries.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser
from django.db import connections
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from ...ledger import conversion, partition_drops, partitions
from ..base import ZeroLossCommand, positive_int
from ..exits import WarningFound

ACTIONS = ("show", "convert")


class Command(ZeroLossCommand):
    help = gettext_noop(
        "Show the ledger's partitions, or convert an unpartitioned PostgreSQL ledger to partitions online."
    )
    changes_data = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=ACTIONS, help=_("What to do."))
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=5000,
            help=_("convert: ids copied per transaction (default: %(default)s)."),
        )

    def handle(self, *, action: str, json: bool, batch_size: int, **options: Any) -> None:
        service = self.service(options)
        conn = connections[service.using]
        settings = service.settings
        if action == "show":
            self._show(conn, as_json=json)
            return
        if not conversion.can_partition(conn):
            self.usage_error(_("only a PostgreSQL ledger is partitioned; SQLite keeps its one table"))
        state = conversion.status(conn)
        if state == "partitioned":
            self.log(_("The ledger is partitioned already; nothing to do."))
            return
        if options["dry_run"]:
            self.stdout.write(
                _(
                    "Would convert the ledger (%(state)s) to partitions of %(period)s seconds, "
                    "%(ahead)s ahead, copying %(batch)s ids per transaction; nothing was changed."
                )
                % {
                    "state": state,
                    "period": int(settings.PARTITION_PERIOD),
                    "ahead": settings.PARTITIONS_AHEAD,
                    "batch": batch_size,
                }
            )
            return
        self.confirm(_("Convert the ledger to partitions (online; it can be resumed)?"), options)

        def report(progress: conversion.Progress) -> None:
            self.log(f"{progress.step}: {progress.detail}", progress.level)

        try:
            conversion.convert(
                conn,
                period=int(settings.PARTITION_PERIOD),
                ahead=settings.PARTITIONS_AHEAD,
                batch_size=batch_size,
                report=report,
            )
        except conversion.ConversionError as exc:
            raise WarningFound(str(exc)) from exc
        self.stdout.write(_("The ledger is partitioned."))

    def _show(self, conn: Any, *, as_json: bool) -> None:
        state = conversion.status(conn)
        found = partitions.partitions(conn) if state == "partitioned" else []
        estimates = partitions.estimated_rows(conn, found)
        covered = partitions.coverage(conn)
        dropping = partition_drops.dropping(conn)
        if as_json:
            self.emit_json(
                {
                    "layout": state,
                    "covered_until": covered.isoformat() if covered else None,
                    "dropping": [
                        {
                            "name": name,
                            "start": start.isoformat(),
                            "end": end.isoformat(),
                            "keys_deleted_to_id": done,
                        }
                        for name, start, end, done in dropping
                    ],
                    "partitions": [
                        {
                            "name": p.name,
                            "start": p.start.isoformat(),
                            "end": p.end.isoformat(),
                            "messages_estimate": estimates.get(p.name, 0),
                        }
                        for p in found
                    ],
                }
            )
            return
        self.stdout.write(_("layout: %(layout)s") % {"layout": state})
        if covered is not None:
            self.stdout.write(_("sends have a partition until %(until)s") % {"until": covered.isoformat()})
        if found:
            self.table(
                [_("partition"), _("from"), _("to"), _("messages (estimate)")],
                [(p.name, p.start.isoformat(), p.end.isoformat(), estimates.get(p.name, 0)) for p in found],
            )
        for name, start, end, _done in dropping:
            self.stdout.write(
                _("dropped, its keys still being deleted: %(name)s (%(start)s to %(end)s)")
                % {"name": name, "start": start.isoformat(), "end": end.isoformat()}
            )
