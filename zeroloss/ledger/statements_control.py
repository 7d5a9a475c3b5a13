"""The statements of queue control (pause, resume, limits), by name: written whole, as each
database runs them, in ``sql/control.sql`` (see :mod:`.catalogue`); part of the ledger's
catalogue (:data:`.statements.WHOLE`).

None of them moves a message: a paused or limited queue's messages stay ``pending`` (no
transition, no audit row); what limits them is which claims run (see :mod:`.control`).
"""

from __future__ import annotations

from .catalogue import Catalogue

CATALOGUE = Catalogue("sql/control.sql")
