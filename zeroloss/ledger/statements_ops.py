"""The operator's bulk statements outside the moves, by name: the purge, the payload sizes that
bound management batches, a maintenance duty's turn, and the sessions of idle workers. Written
whole, as each database runs them, in ``sql/ops.sql`` (see :mod:`.catalogue`)."""

from __future__ import annotations

from .catalogue import Catalogue

CATALOGUE = Catalogue("sql/ops.sql")
