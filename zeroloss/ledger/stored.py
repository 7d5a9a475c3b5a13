"""What a send stored: its rows built without a read-back, read back, and matched against a resend."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.db.models.base import ModelState

from ..exceptions import MessageConflict
from .engine import Engine
from .models import Message, Status
from .validation import scan_json

#: Messages a statement stores or reads back at most (one batch parameter, whatever their number).
MANY_CHUNK = 5000

#: The columns every newly stored message starts with, whatever it holds (the rest come from
#: its ``Prepared`` and the statement that stored it).
NEW_ROW: dict[str, Any] = {
    "status": Status.PENDING,
    "attempts": 0,
    "lease_token": None,
    "lease_expires_at": None,
    "claimed_by": "",
    "started_at": None,
    "last_error": "",
    "result": None,
    "commit_lsn": None,
    "completed_at": None,
    "dead_at": None,
    "headers": None,
}


class Prepared(NamedTuple):
    """One validated message, as it will be stored. (A named tuple: one is built for every
    message sent, and a frozen dataclass costs three times as much to build.)"""

    message_id: str
    queue_name: str
    encoded: str
    checksum: str
    max_attempts: int
    priority: int
    ordering_key: str
    #: The headers' JSON text; None: none (the statements without a headers column).
    headers: str | None = None


def materialize(
    p: Prepared,
    pk: int,
    created_at: dt.datetime,
    available_at: dt.datetime | None,
    dispatched_at: dt.datetime | None,
    using: str,
) -> Message:
    """The stored row as a model instance, without a read-back query.

    Built like ``Model.from_db`` but without ``__init__`` (and so without its pre/post
    init signals): at bulk sizes ``__init__`` was a quarter of persist's Python time.
    """
    state = ModelState()
    state.adding = False
    state.db = using
    message = Message.__new__(Message)
    message.__dict__ = {
        **NEW_ROW,
        "_state": state,
        "id": pk,
        "message_id": p.message_id,
        "queue_name": p.queue_name,
        "payload": scan_json(p.encoded, 0)[0],
        "checksum": p.checksum,
        "max_attempts": p.max_attempts,
        "priority": p.priority,
        "ordering_key": p.ordering_key,
        "available_at": available_at,
        "replication_targets": [],
        "headers": None if p.headers is None else scan_json(p.headers, 0)[0],
        "dispatched_at": dispatched_at,
        "created_at": created_at,
        "updated_at": created_at,
    }
    return message


def stored_rows(engine: Engine, using: str, message_ids: Sequence[str]) -> dict[str, Message]:
    """The stored messages of these ids, one query a chunk (the ids go as one batch: no
    parameter a message, whatever the database's limit on them)."""
    found: dict[str, Message] = {}
    sql = engine.sql["STORED_ROWS"]
    for start in range(0, len(message_ids), MANY_CHUNK):
        params = {"mid": engine.column(message_ids[start : start + MANY_CHUNK])}
        found.update((m.message_id, m) for m in Message.objects.using(using).raw(sql, params))
    return found


def existing_match(using: str, p: Prepared, existing: Message | None = None) -> Message:
    """The stored message for an id whose insert conflicted: same content, or a conflict.
    ``existing``: the row as a batch read it (else it is read here)."""
    if existing is None:
        existing = Message.objects.using(using).filter(message_id=p.message_id).first()
    if existing is None:  # deleted (purged) between our insert and this read
        raise MessageConflict(p.message_id, "a concurrent purge of the same id")
    if existing.queue_name != p.queue_name:
        raise MessageConflict(p.message_id, f"queue {existing.queue_name!r} (not {p.queue_name!r})")
    if existing.checksum != p.checksum:
        raise MessageConflict(p.message_id, "a different payload (checksum mismatch)")
    return existing
