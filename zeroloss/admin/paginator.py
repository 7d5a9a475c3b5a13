"""Counting a large ledger without ``COUNT(*)`` over all of it."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.utils.functional import cached_property

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
        if not qs.query.where and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
                    [qs.model._meta.db_table],
                )
                row = cursor.fetchone()
            estimate = int(row[0]) if row and row[0] is not None else -1
            if estimate >= ESTIMATE_ABOVE:
                self.estimated = True
                return estimate
        counted = int(qs.order_by()[: COUNT_CAP + 1].count())
        if counted > COUNT_CAP:
            self.capped = True
            return COUNT_CAP
        return counted
