"""The reads of the snapshot, verify, the admin, the health checks and the system checks, by
name: written whole, as each database runs them, in ``sql/reads.sql`` (see :mod:`.catalogue`).
Those that read PostgreSQL's statistics run where ``Engine.has_statistics``."""

from __future__ import annotations

from .catalogue import Catalogue
from .models import Status

CATALOGUE = Catalogue("sql/reads.sql")

#: The statuses whose messages ``CONSERVATION`` counts, in the order of its columns.
CONSERVATION_STATUSES = tuple(s.value for s in Status)


#: Written per call: the table and the column are identifiers (quoted by the caller), which no
#: statement can take as parameters.
def distinct_walk(table: str, column: str) -> str:
    """The first ``%s`` distinct values of an indexed column, in order, by a recursive walk (a
    "loose index scan"): each step is one probe of an index that starts with the column, for
    the smallest value above the previous one. ``table`` and ``column`` come quoted."""
    return (
        f"WITH RECURSIVE walk(value, n) AS (SELECT MIN({column}), 1 FROM {table} "
        f"UNION ALL SELECT (SELECT MIN({column}) FROM {table} WHERE {column} > walk.value), n + 1 "
        "FROM walk WHERE walk.value IS NOT NULL AND n < %s) SELECT value FROM walk WHERE value IS NOT NULL"
    )
