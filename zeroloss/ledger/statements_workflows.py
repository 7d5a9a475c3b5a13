"""The statements of workflows (part of the catalogue: :mod:`.statements` imports them), written
whole in ``sql/workflows.sql``; the edges of its moving statements are declared here.

A step's release runs in the transaction of the outcome that settled its last dependency, after
that outcome's fenced statement: only the rows it moved are settled (``SETTLE_*``), so an outcome
refused as stale releases nothing (docs/workflows.md).
"""

from __future__ import annotations

from ..core.states import Reason
from ..core.states import Status as S
from .catalogue import Catalogue
from .statements_moves import Moving, edge

CATALOGUE = Catalogue("sql/workflows.sql")

MOVES: dict[str, Moving] = {
    # A workflow's steps, stored with the workflow: pending when they depend on nothing.
    "STEP_INSERT": Moving(
        "producer",
        (edge("", S.PENDING, Reason.PERSISTED), edge("", S.WAITING, Reason.PERSISTED)),
        prepare=False,
    ),
    "STEP_RELEASE": Moving("dependency", (edge(S.WAITING, S.PENDING, Reason.DEPENDENCIES_COMPLETED),)),
    "STEP_CANCEL": Moving("dependency", (edge(S.WAITING, S.CANCELLED, Reason.UPSTREAM_FAILED),)),
    "STEP_RELEASE_STRANDED": Moving(
        "dependency", (edge(S.WAITING, S.PENDING, Reason.DEPENDENCIES_COMPLETED),), prepare=False
    ),
    "STEP_CANCEL_BY_OPERATOR": Moving(
        "operator", (edge(S.WAITING, S.CANCELLED, Reason.CANCELLED_BY_OPERATOR),), prepare=False
    ),
}
