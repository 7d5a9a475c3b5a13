"""The statements of cancel and abort (part of the catalogue: :mod:`.statements` imports them).

A pending message is cancelled by an operator at once. A processing one is not moved by the
operator: an abort request is recorded on it (``abort_requested_at``, with an annotation audit
row), the worker holding it polls for it, and when its handler ends the fenced outcome
statements refuse to record anything but ``cancelled`` for it (:data:`NOT_ABORTED` in every
one of them; :data:`CANCEL_ABORTED` records the outcome). A worker that died with it: the sweep
records it cancelled instead of requeueing it.
"""

from __future__ import annotations

from ..states import Reason
from ..states import Status as S
from .catalogue import Catalogue
from .statements_moves import Moving, edge

#: The operator's statements (CANCEL, ABORT_REQUEST, STATUS_OF), written whole.
CATALOGUE = Catalogue("sql/cancel.sql")
# ``{in_period}``: see statements_leases._FENCE.
_HELD = "{msg}.message_id = b.mid AND {msg}.lease_token = b.tok AND {msg}.status = 'processing'{in_period}"

#: Added to every fenced outcome statement of a lease holder: an aborted message's handler
#: ended, whatever it returned; only CANCEL_ABORTED may record it.
NOT_ABORTED = " AND {msg}.abort_requested_at IS NULL"

# The lease keeper: which of the leases in hand have an abort request.
ABORTS_REQUESTED = (
    "SELECT {msg}.message_id FROM {msg}, {rows} WHERE " + _HELD + " AND {msg}.abort_requested_at IS NOT NULL"
)
# The lease holder's outcome of an aborted message, fenced like every other outcome.
_CANCEL_ABORTED = (
    "UPDATE {msg} SET status = 'cancelled', lease_token = NULL, lease_expires_at = NULL, updated_at = {now} "
    "FROM {rows} WHERE " + _HELD + " AND {msg}.abort_requested_at IS NOT NULL"
)
CANCEL_ABORTED = _CANCEL_ABORTED + " AND {msg}.lease_expires_at > {clock}"
# Inside a transactional batch whose rows this transaction locked (see statements.ACK_LOCKED).
CANCEL_ABORTED_LOCKED = _CANCEL_ABORTED

ROWS: dict[str, tuple[tuple[str, str], ...]] = {
    "ABORTS_REQUESTED": (("mid", "text"), ("tok", "uuid")),
    "CANCEL_ABORTED": (("mid", "text"), ("tok", "uuid")),
    "CANCEL_ABORTED_LOCKED": (("mid", "text"), ("tok", "uuid")),
}

#: The edges each moving statement of this module performs (see :mod:`.statements_moves`).
_ABORTED = Moving("worker", (edge(S.PROCESSING, S.CANCELLED, Reason.ABORTED),), prepare=False)
MOVES: dict[str, Moving] = {
    "CANCEL": Moving(
        "operator", (edge(S.PENDING, S.CANCELLED, Reason.CANCELLED_BY_OPERATOR),), prepare=False
    ),
    # An annotation: the message stays processing (states.ANNOTATIONS).
    "ABORT_REQUEST": Moving(
        "operator", (edge(S.PROCESSING, S.PROCESSING, Reason.ABORT_REQUESTED),), prepare=False
    ),
    "CANCEL_ABORTED": _ABORTED,
    "CANCEL_ABORTED_LOCKED": _ABORTED,
}
