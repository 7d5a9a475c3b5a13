"""The lease holder's side of an abort: which messages in hand were aborted, and their outcome.

An operator's abort (:meth:`.operator.Operator.cancel_messages` with ``abort=True``) only records
the request on the message. The worker holding it reads the requests of its leases (the lease
keeper asks every ``ABORT_POLL_INTERVAL``), and when the handler ends the fenced outcome
statements refuse it every outcome but ``cancelled``, which :meth:`Aborts.cancel_aborted`
records, fenced like the others (the current token, still processing, lease unexpired).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import transaction

from .base import Part
from .types import Lease

#: How often (seconds, at most) the lease keeper asks whether a message in hand was aborted:
#: a handler sees ``delivery.abort_requested`` within this and one query's time.
ABORT_POLL_INTERVAL = 0.25
_ABORTED_DETAIL = "aborted by an operator: the handler's outcome was not recorded"


class Aborts(Part):
    """Aborts as the lease holder sees them: which were requested, and recording them."""

    def aborts_requested(self, leases: Iterable[Lease]) -> set[str]:
        """The ids of ``leases`` (still held) whose abort an operator requested."""
        held = list(leases)
        if not held:
            return set()
        engine = self.engine
        batch = engine.batch(mid=[x.message_id for x in held], tok=[engine.token(x.token) for x in held])
        rows, _ = self._run(
            "ABORTS_REQUESTED", {**batch, **engine.period([x.created_at for x in held])}, prepare=True
        )
        return {r[0] for r in rows}

    def cancel_aborted(
        self,
        ids: list[str],
        tokens: list[Any],
        created: Sequence[dt.datetime | None] = (),
        *,
        locked: bool = False,
    ) -> list[str]:
        """Record ``cancelled`` for those of the leases whose abort was requested (the others are
        left as they are: the caller's outcome statements skipped them for another reason).
        ``created``: the leases' creation times (empty: unknown)."""
        name = "CANCEL_ABORTED_LOCKED" if locked else "CANCEL_ABORTED"
        params = {**self.engine.batch(mid=ids, tok=tokens), **self.engine.period(created)}
        with transaction.atomic(using=self.using, savepoint=False):
            rows = self._move(name, params, detail=_ABORTED_DETAIL)
            self.ctx.workflows.settle_moved(rows)  # a workflow's step ended: its dependents
        return [r[1] for r in rows]
