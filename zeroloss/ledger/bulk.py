"""Large batches, stored through PostgreSQL's bulk path: COPY.

:meth:`~.persist.Store.persist_messages` hands a batch of ``Engine.stage_from`` messages or
more here (PostgreSQL; SQLite has no threshold). A batch of new messages draws its ids from the
sequence (in the batch's order) and one reading of the database clock, then COPYs the message
rows and their ``persisted`` audit rows, in a savepoint of the caller's transaction. If an id is
stored already (a resend), the COPY fails on it; the savepoint is rolled back and the batch goes
the idempotent way: COPY'd into a temporary table, then ``INSERT_MANY``'s statement reading it
(``ON CONFLICT (message_id) DO NOTHING``, audit rows in the same statement). Either way what
differs from small batches is cost only: COPY's text rows are a few string operations each,
where psycopg dumps array parameters in Python, and the checks that are the same for every item
of the batch run once.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.db.models.base import ModelState

from ..exceptions import InvalidMessage, PayloadTooLarge
from .models import Message
from .statements import MOVES
from .statements_moves import audit_row
from .stored import NEW_ROW, Prepared, existing_match
from .validation import (
    canonical_json,
    encode_headers,
    payload_checksum,
    validate_attempts,
    validate_key,
    validate_message_id,
    validate_priority,
    validate_queue_name,
)

if TYPE_CHECKING:
    from .persist import Store

NULL = "\\N"  # COPY's text format
#: The edge of every message a COPY stores (the statement it stands in for: INSERT_STAGED).
INSERT_STAGED_EDGE = MOVES["INSERT_STAGED"].edges[0]
#: Rows per ``COPY`` write (about a megabyte of text for small payloads).
_COPY_CHUNK = 5000


def persist_staged(
    store: Store,
    items: list[Any],
    max_attempts: int | None,
    delay: Any,
    actor: str | None,
    dispatched: bool,
    priority: int,
    ordering_key: str,
) -> list[Message] | None:
    """``persist_messages`` for a large batch; ``None`` when an option is invalid (the caller's
    checks then raise exactly what they always did)."""
    try:
        attempts = validate_attempts(store.settings.MAX_ATTEMPTS if max_attempts is None else max_attempts)
        priority = validate_priority(priority)
        ordering_key = validate_key(ordering_key, "ordering_key")
        delay_s = store.validated_delay(delay, ordering_key)
    except InvalidMessage:
        return None
    batch = _Batch(store, items, attempts, priority, ordering_key)
    with _no_cyclic_gc(), transaction.atomic(using=store.using):
        result = _store(store, batch, delay_s, actor or store.instance_id, dispatched)
    store.confirm_replicated(result)
    return result


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Python's cycle collector paused while a batch allocates its objects (several per message,
    none in cycles): its collections, which scan every live object, were measured at 40% of the
    batch's client CPU. Reference counting still frees everything; collection resumes after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Batch:
    """A batch's items, validated and encoded a chunk at a time (``Store._prepare`` of each
    item, the options checked once; the same errors).

    COPY streams each chunk to the server as soon as it is ready, so the server stores one
    chunk while the next is encoded: the two overlap (measured: the client's share was 45% of
    the batch's time). An invalid item met on the way raises inside the COPY; it is aborted
    with its savepoint, and nothing of the batch is stored.
    """

    def __init__(self, store: Store, items: list[Any], attempts: int, priority: int, ordering_key: str):
        self.items = items
        self.limit = store.settings.MAX_PAYLOAD_BYTES
        self.headers_limit = store.settings.MAX_HEADERS_BYTES
        self.attempts = attempts
        self.priority = priority
        self.ordering_key = ordering_key
        self.queues: set[str] = set()
        self.prepared: list[Prepared] = []
        self.checked = False

    def __len__(self) -> int:
        return len(self.items)

    def chunks(self) -> Iterator[list[Prepared]]:
        """The chunks not prepared yet; after the last, every id is known to be unique."""
        for start in range(len(self.prepared), len(self.items), _COPY_CHUNK):
            chunk = [self._prepare(n) for n in range(start, min(start + _COPY_CHUNK, len(self.items)))]
            self.prepared.extend(chunk)
            yield chunk
        if not self.checked:
            if len({p.message_id for p in self.prepared}) != len(self.prepared):
                seen: set[str] = set()
                for p in self.prepared:
                    if p.message_id in seen:
                        raise InvalidMessage(f"message_id {p.message_id!r} appears twice in one batch.")
                    seen.add(p.message_id)
            self.checked = True

    def all(self) -> list[Prepared]:
        for _ in self.chunks():
            pass
        return self.prepared

    def _prepare(self, n: int) -> Prepared:
        item = self.items[n]
        if not isinstance(item, tuple | list) or not 3 <= len(item) <= 4:
            raise InvalidMessage(
                f"item {n} must be a (message_id, queue_name, data[, headers]) tuple, got {item!r}."
            )
        message_id, queue_name, data = item[:3]
        try:
            message_id = validate_message_id(message_id)
            if not (isinstance(queue_name, str) and queue_name in self.queues):
                self.queues.add(validate_queue_name(queue_name))
            encoded = canonical_json(data)
            # At most 4 UTF-8 bytes a character: most payloads need no encoding to be measured.
            if len(encoded) * 4 > self.limit and (size := len(encoded.encode("utf-8"))) > self.limit:
                raise PayloadTooLarge(
                    f"Payload of message {message_id!r} is {size} bytes of JSON; the limit is "
                    f"{self.limit} (ZEROLOSS['MAX_PAYLOAD_BYTES'])."
                )
            headers = None if len(item) == 3 else encode_headers(item[3], self.headers_limit)
        except InvalidMessage as exc:
            raise type(exc)(f"item {n} ({item[0]!r}): {exc} Nothing of the batch was stored.") from exc
        return Prepared(
            message_id,
            queue_name,
            encoded,
            payload_checksum(encoded),
            self.attempts,
            self.priority,
            self.ordering_key,
            headers,
        )


def _text(value: str) -> str:
    # COPY's text format escapes with backslashes. Tabs, newlines and carriage returns never
    # occur: ids and keys refuse control characters, queue names are [A-Za-z0-9_.:-], and
    # canonical JSON escapes every control character.
    return value.replace("\\", "\\\\") if "\\" in value else value


def _lines(prepared: Sequence[Prepared]) -> Iterator[str]:
    for start in range(0, len(prepared), _COPY_CHUNK):
        yield "".join(
            [
                f"{n}\t{_text(p.message_id)}\t{p.queue_name}\t{_text(p.encoded)}\t{p.checksum}\t"
                f"{p.max_attempts}\t{p.priority}\t{_text(p.ordering_key)}\t"
                f"{NULL if p.headers is None else _text(p.headers)}\n"
                for n, p in enumerate(prepared[start : start + _COPY_CHUNK], start)
            ]
        )


def _store(store: Store, batch: _Batch, delay_s: float, actor: str, dispatched: bool) -> list[Message]:
    """``Store._store`` for a large batch: insert what is new, read back what existed."""
    engine, conn = store.engine, store.connection
    validate_message_id(actor, "actor")
    created: dt.datetime | None
    try:
        # A savepoint: an invalid item undoes the COPY; so does an id stored already (a
        # resend), and the staged statement below sorts new from stored.
        with transaction.atomic(using=store.using):
            stored, created = _copy(store, batch, delay_s, actor, dispatched)
    except IntegrityError:
        stored, created = _staged(store, batch.all(), delay_s, actor, dispatched)
    prepared = batch.prepared
    new = [p for p in prepared if p.message_id in stored]
    later = None if created is None else created + dt.timedelta(seconds=delay_s)
    if new:
        # One wake-up per queue, as the per-row NOTIFY of INSERT_MANY amounts to at commit.
        engine.wake(conn, sorted({p.queue_name for p in new}))
    # One json.loads for the whole batch: the same values as one per payload, without the
    # per-call overhead.
    payloads = iter(json.loads("[" + ",".join([p.encoded for p in new]) + "]"))
    common = {
        **NEW_ROW,
        "dispatched_at": created if dispatched else None,
        "created_at": created,
        "updated_at": created,
    }
    existing = _read_existing(store, [p.message_id for p in prepared if p.message_id not in stored])
    existing.update(
        store.stored_again(
            [p for p in prepared if p.message_id not in stored], existing, delay_s, actor, dispatched
        )
    )
    result = []
    for p in prepared:
        pk = stored.get(p.message_id)
        if pk is None:
            found = existing.get(p.message_id)
            if found is None or found.queue_name != p.queue_name or found.checksum != p.checksum:
                found = existing_match(store.using, p)  # raises MessageConflict, saying what differs
            result.append(found)
            continue
        # As ``stored.materialize`` builds it: a model instance without ``__init__``.
        message = Message.__new__(Message)
        state = message._state = ModelState()
        state.adding = False
        state.db = store.using
        fields = message.__dict__
        fields.update(common)
        fields["id"] = pk
        fields["message_id"] = p.message_id
        fields["queue_name"] = p.queue_name
        fields["payload"] = next(payloads)
        fields["checksum"] = p.checksum
        fields["max_attempts"] = p.max_attempts
        fields["priority"] = p.priority
        fields["ordering_key"] = p.ordering_key
        fields["available_at"] = None if p.ordering_key else later
        fields["replication_targets"] = []
        if p.headers is not None:
            fields["headers"] = json.loads(p.headers)
        result.append(message)
    keys = {(p.queue_name, p.ordering_key) for p in new if p.ordering_key}
    if keys:
        store.ctx.promote_after_commit(keys, [p.message_id for p in new if p.ordering_key])
    return result


def _copy(
    store: Store, batch: _Batch, delay_s: float, actor: str, dispatched: bool
) -> tuple[dict[str, int], dt.datetime]:
    """All new: the message rows and their audit rows COPY'd, at PostgreSQL's bulk speed."""
    engine, conn = store.engine, store.connection
    rows, _ = engine.execute(conn, engine.sql["RESERVE_IDS"], {"count": len(batch)})
    # One clock reading for the batch, as one INSERT statement has.
    created = engine.at(rows[0][0])
    pks = rows[0][1].split(",")
    at = created.isoformat()
    available = (created + dt.timedelta(seconds=delay_s)).isoformat()
    tail = f"\t\t\t[]\t{at}\t{at}\t{at if dispatched else NULL}\t"

    def messages() -> Iterator[str]:
        start = 0
        for chunk in batch.chunks():
            yield "".join(
                [
                    f"{pk}\t{_text(p.message_id)}\t{p.queue_name}\t{_text(p.encoded)}\t{p.checksum}\tpending\t0\t"
                    f"{p.max_attempts}\t{p.priority}\t{_text(p.ordering_key)}\t{NULL if p.ordering_key else available}"
                    + tail
                    + (NULL if p.headers is None else _text(p.headers))
                    + "\n"
                    for p, pk in zip(chunk, pks[start : start + len(chunk)], strict=True)
                ]
            )
            start += len(chunk)

    # Every row of the batch has the same audit row but for its message: derived once.
    _, *rest = audit_row(INSERT_STAGED_EDGE, None, 0, at, actor, "", at)
    event = "\t" + "\t".join(_text(str(v)) for v in rest) + "\n"
    engine.copy_in(conn, engine.sql["COPY_MESSAGES"], messages())
    # Their ids into the key table (prepared now: the messages' COPY prepared them): one stored
    # already fails this COPY (or the one before, on an unpartitioned ledger), and the staged
    # statement sorts new from stored, as a smaller batch's statement does (sql/inserts.sql).
    keys = batch.prepared
    engine.copy_in(
        conn,
        engine.sql["COPY_KEYS"],
        (
            "".join(f"{_text(p.message_id)}\t{at}\n" for p in keys[start : start + _COPY_CHUNK])
            for start in range(0, len(keys), _COPY_CHUNK)
        ),
    )
    engine.copy_in(conn, engine.sql["COPY_EVENTS"], (f"{pk}{event}" for pk in pks))
    return {p.message_id: int(pk) for p, pk in zip(batch.prepared, pks, strict=True)}, created


def _staged(
    store: Store, prepared: Sequence[Prepared], delay_s: float, actor: str, dispatched: bool
) -> tuple[dict[str, int], dt.datetime | None]:
    """Some stored already: the rows staged, then ``INSERT_MANY``'s statement on them."""
    engine, conn = store.engine, store.connection
    engine.execute(conn, engine.sql["STAGE_CREATE"], {})
    engine.copy_in(conn, engine.sql["STAGE_COPY"], _lines(prepared))
    rows = store.ctx.move("INSERT_STAGED", {"delay": delay_s, "dispatched": dispatched}, actor=actor)
    engine.execute(conn, engine.sql["STAGE_DROP"], {})
    if not rows:
        return {}, None
    # One statement, one clock reading: every row it stored has the same times.
    return {mid: pk for pk, mid in rows}, engine.at(store.ctx.run("CREATED_AT", {"id": rows[0][0]})[0][0][0])


def _read_existing(store: Store, message_ids: list[str]) -> dict[str, Message]:
    """The stored messages of ids whose insert conflicted, read 5,000 a query (a resent batch
    would otherwise cost a query a message)."""
    found: dict[str, Message] = {}
    for start in range(0, len(message_ids), _COPY_CHUNK):
        chunk = message_ids[start : start + _COPY_CHUNK]
        found.update(
            (m.message_id, m) for m in Message.objects.using(store.using).filter(message_id__in=chunk)
        )
    return found
