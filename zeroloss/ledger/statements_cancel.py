"""The statements of cancel and abort (part of the catalogue: :mod:`.statements` imports them).

A pending message is cancelled by an operator at once. A processing one is not moved by the
operator: an abort request is recorded on it (``abort_requested_at``, with an annotation audit
row), the worker holding it polls for it, and when its handler ends the fenced outcome
statements refuse to record anything but ``cancelled`` for it (``abort_requested_at IS NULL``
in every one of them; ``CANCEL_ABORTED`` records the outcome). A worker that died with it: the
sweep records it cancelled instead of requeueing it. Its statements are written whole in
``sql/cancel.sql``; their edges are declared here.
"""

from __future__ import annotations

from ..core.states import Reason
from ..core.states import Status as S
from .catalogue import Catalogue
from .statements_moves import Moving, edge

CATALOGUE = Catalogue("sql/cancel.sql")

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
