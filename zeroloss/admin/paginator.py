"""Counting a large ledger without ``COUNT(*)`` over all of it."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.utils.functional import cached_property

from ..ledger import statements_reads
from ..ledger.base import engine_for

#: Above this many rows an unfiltered changelist shows PostgreSQL's estimate, not COUNT(*).
ESTIMATE_ABOVE = 100_000
#: Filtered changelists count at most this many rows ("10 000+" pages beyond are not offered).
COUNT_CAP = 10_000


class LedgerPaginator(Paginator):
    """A paginator that never runs an unbounded ``COUNT(*)`` over a large ledger.

    Unfiltered on PostgreSQL it uses the planner's estimate (``pg_class.reltuples``) once
    the table is large; otherwise it counts at most :data:`COUNT_CAP` rows.
    """

    estimated = False
    capped = False

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if not isinstance(qs, QuerySet):
            return len(qs)
        connection = connections[qs.db]
        engine = engine_for(connection)
        if not qs.query.where and engine.has_statistics:
            found, _ = engine.run(
                connection, statements_reads, "TABLE_ROWS_ANALYSED", {"table": qs.model._meta.db_table}
            )
            row = found[0] if found else None
            estimate = int(row[0]) if row and row[0] is not None else -1
            if estimate >= ESTIMATE_ABOVE:
                self.estimated = True
                return estimate
        counted = int(qs.order_by()[: COUNT_CAP + 1].count())
        if counted > COUNT_CAP:
            self.capped = True
            return COUNT_CAP
        return counted
