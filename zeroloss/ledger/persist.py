"""Storing messages: idempotent by message id, deduplicated by key, ordered by key."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import DatabaseError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from ..exceptions import InvalidMessage, PayloadTooLarge
from . import partition_drops, periods
from .base import Part, engine_for
from .bulk import persist_staged
from .hooks import replication
from .models import Message
from .stored import MANY_CHUNK as _MANY_CHUNK
from .stored import Prepared as _Prepared
from .stored import existing_match, materialize, stored_rows
from .validation import (
    canonical_json,
    clean_text,
    encode_headers,
    payload_checksum,
    seconds,
    validate_attempts,
    validate_key,
    validate_message_id,
    validate_priority,
    validate_queue_name,
)

#: What ``persist_message`` returns: the stored row.
PersistedMessage = Message

#: Queue names already found valid (the same few names come with every message).
_CHECKED_QUEUES: set[str] = set()


class Store(Part):
    """Storing messages, one or many (large batches: :mod:`.bulk`)."""

    def _prepare(
        self,
        message_id: Any,
        queue_name: Any,
        data: Any,
        max_attempts: Any,
        priority: Any,
        ordering_key: Any,
        headers: Any = None,
    ) -> _Prepared:
        message_id = validate_message_id(message_id)
        if not (queue_name.__class__ is str and queue_name in _CHECKED_QUEUES):
            queue_name = validate_queue_name(queue_name)
            if len(_CHECKED_QUEUES) < 10_000:
                _CHECKED_QUEUES.add(queue_name)
        # The setting was checked when the settings were read (same bounds).
        max_attempts = self.settings.MAX_ATTEMPTS if max_attempts is None else validate_attempts(max_attempts)
        encoded = canonical_json(data)
        limit = self.settings.MAX_PAYLOAD_BYTES
        # At most 4 UTF-8 bytes a character: most payloads need no encoding to be measured.
        if len(encoded) * 4 > limit and (size := len(encoded.encode("utf-8"))) > limit:
            raise PayloadTooLarge(
                f"Payload of message {message_id!r} is {size} bytes of JSON; the limit is "
                f"{self.settings.MAX_PAYLOAD_BYTES} (ZEROLOSS['MAX_PAYLOAD_BYTES'])."
            )
        return _Prepared(
            message_id,
            queue_name,
            encoded,
            payload_checksum(encoded),
            max_attempts,
            validate_priority(priority),
            "" if ordering_key == "" else validate_key(ordering_key, "ordering_key"),
            None if headers is None else encode_headers(headers, self.settings.MAX_HEADERS_BYTES),
        )

    def persist_message(
        self,
        message_id: str,
        queue_name: str,
        data: Any,
        max_attempts: int | None = None,
        *,
        delay: float | dt.timedelta | None = None,
        actor: str | None = None,
        dispatched: bool = False,
        priority: int = 0,
        ordering_key: str = "",
        dedup_key: str = "",
        dedup_window: float | dt.timedelta | None = None,
        headers: dict[str, Any] | None = None,
    ) -> PersistedMessage:
        """Store a message. Durable when it returns (or, inside a transaction, when that commits).

        Idempotent: the same id with the same queue and payload returns the stored message;
        a different queue or payload raises :class:`MessageConflict` and changes nothing.
        With ``dedup_key``, a second message of the same queue and key within
        ``dedup_window`` seconds (default ``DEDUP_WINDOW``) returns the first one instead,
        whatever its id. With ``ordering_key``, messages of the queue sharing the key are
        handled one at a time, in the order they were stored (docs/ordering.md).
        ``headers`` (a dict of names to JSON values) are stored with the message and given to its
        handler (``delivery.headers``); they are not part of the checksum: a resend with other
        headers returns the stored message, its headers unchanged (docs/headers.md).
        """
        # (Inline checks of the common case, no key and no delay: every call counts here.)
        dedup = "" if dedup_key == "" else validate_key(dedup_key, "dedup_key")
        window = 0.0
        if dedup or dedup_window is not None:
            window = seconds(
                self.settings.DEDUP_WINDOW if dedup_window is None else dedup_window, "dedup_window"
            )
        if dedup and window <= 0:
            raise InvalidMessage("dedup_window must be more than 0 seconds when a dedup_key is given.")
        prepared = self._prepare(message_id, queue_name, data, max_attempts, priority, ordering_key, headers)
        delay_s = 0.0 if delay is None else self.validated_delay(delay, prepared.ordering_key)
        actor = actor or self.instance_id
        self.period_ready()
        if not dedup:
            # What persist_messages does for one item, without its batch bookkeeping. The
            # connection is looked up once (each lookup is a thread-local read: about 1 us).
            conn = self.connection
            if engine_for(conn).moves_in_one_statement:
                # One statement, autocommit: the fastest durable write.
                try:
                    message = self._store_one(prepared, delay_s, actor, dispatched, conn)
                except DatabaseError as exc:
                    # Its period dropped since this process looked (by hand): created, and
                    # stored again (nothing was stored: one statement).
                    if conn.in_atomic_block or not periods.missing_period(exc):
                        raise
                    periods.forget(self.using)
                    self.period_ready()
                    message = self._store_one(prepared, delay_s, actor, dispatched, conn)
            else:
                with transaction.atomic(using=self.using):
                    message = self._store_one(prepared, delay_s, actor, dispatched, conn)
            if self.settings.PERSISTENCE_LEVEL == "replicated":
                self.confirm_replicated([message])
            return message
        with transaction.atomic(using=self.using):
            window_of = {
                "queue": prepared.queue_name,
                "dedup_key": dedup,
                "mid": prepared.message_id,
                "window": window,
            }
            claimed, _ = self._run("DEDUP_CLAIM", window_of)
            if not claimed:
                holder = self._run("DEDUP_HOLDER", window_of)[0][0][0]
                first = Message.objects.using(self.using).filter(message_id=holder).first()
                if first is not None and holder != prepared.message_id:
                    detail = clean_text(f"send of {prepared.message_id!r} absorbed by dedup key {dedup!r}")
                    self._run("ABSORBED", {"actor": actor, "detail": detail, "mid": holder})
                    return first
                if first is None:  # the first message was purged: this one takes the window over
                    self._run("DEDUP_TAKE_OVER", window_of)
            result = self._store([prepared], delay_s, actor, dispatched)
        self.confirm_replicated(result)
        return result[0]

    def persist_messages(
        self,
        items: Iterable[tuple[Any, ...]],
        *,
        max_attempts: int | None = None,
        delay: float | dt.timedelta | None = None,
        actor: str | None = None,
        dispatched: bool = False,
        priority: int = 0,
        ordering_key: str = "",
    ) -> list[PersistedMessage]:
        """Store many ``(message_id, queue_name, data)`` messages in one transaction (an item
        ``(message_id, queue_name, data, headers)`` has headers, as ``persist_message``'s).

        All or nothing: one invalid item or conflicting id and nothing of the batch is stored
        (the error names the item). ``dispatched=True`` records that the caller will publish a
        broker message for each (``zeroloss.send`` does, after commit); the sweep publishes
        again if none arrives.
        """
        items = list(items)
        self.period_ready()
        if len(items) >= self.engine.stage_from > 0:
            staged = persist_staged(
                self, items, max_attempts, delay, actor, dispatched, priority, ordering_key
            )
            if staged is not None:
                return staged
        prepared = []
        for n, item in enumerate(items):
            if not isinstance(item, tuple | list) or not 3 <= len(item) <= 4:
                raise InvalidMessage(
                    f"item {n} must be a (message_id, queue_name, data[, headers]) tuple, got {item!r}."
                )
            try:
                headers = item[3] if len(item) == 4 else None
                prepared.append(
                    self._prepare(item[0], item[1], item[2], max_attempts, priority, ordering_key, headers)
                )
            except InvalidMessage as exc:
                if len(items) == 1:
                    raise
                raise type(exc)(f"item {n} ({item[0]!r}): {exc} Nothing of the batch was stored.") from exc
        if not prepared:
            return []
        seen: set[str] = set()
        for p in prepared:
            if p.message_id in seen:
                raise InvalidMessage(f"message_id {p.message_id!r} appears twice in one batch.")
            seen.add(p.message_id)
        delay_s = self.validated_delay(delay, prepared[0].ordering_key)
        actor = actor or self.instance_id
        if len(prepared) == 1 and self.engine.moves_in_one_statement:
            # One statement, autocommit: the fastest durable write.
            result = self._store(prepared, delay_s, actor, dispatched)
        else:
            with transaction.atomic(using=self.using):
                result = self._store(prepared, delay_s, actor, dispatched)
        self.confirm_replicated(result)
        return result

    def period_ready(self) -> None:
        """The period a message stored now goes to exists (a partitioned ledger; :mod:`.periods`)."""
        periods.ready(self.using, self.settings.PARTITION_PERIOD, self.settings.PARTITIONS_AHEAD)

    def validated_delay(self, delay: float | dt.timedelta | None, ordering_key: str) -> float:
        delay_s = seconds(delay, "delay")
        if delay_s and ordering_key:
            raise InvalidMessage(
                "An ordered message cannot be delayed: it becomes claimable when the message before it "
                "finishes. Send it without delay (or without ordering_key)."
            )
        return delay_s

    def confirm_replicated(self, messages: Sequence[Message]) -> None:
        if self.settings.PERSISTENCE_LEVEL == "replicated":
            replication().confirm(self.ctx.service, messages)

    def _store(
        self, prepared: Sequence[_Prepared], delay_s: float, actor: str, dispatched: bool
    ) -> list[Message]:
        """Insert what is new (with its ``persisted`` audit row); read back what existed."""
        conn = self.connection
        if len(prepared) == 1:
            return [self._store_one(prepared[0], delay_s, actor, dispatched, conn)]
        engine = engine_for(conn)
        stored: dict[str, tuple[int, dt.datetime, dt.datetime | None]] = {}
        for start in range(0, len(prepared), _MANY_CHUNK):
            chunk = prepared[start : start + _MANY_CHUNK]
            columns: dict[str, list[Any]] = {
                "mid": [p.message_id for p in chunk],
                "q": [p.queue_name for p in chunk],
                "payload": [p.encoded for p in chunk],
                "checksum": [p.checksum for p in chunk],
                "max_attempts": [p.max_attempts for p in chunk],
                "priority": [p.priority for p in chunk],
                "k": [p.ordering_key for p in chunk],
            }
            name = "INSERT_MANY"
            if any(p.headers is not None for p in chunk):
                name = "INSERT_MANY_HEADERS"
                columns["headers"] = [p.headers for p in chunk]
            batch = {"delay": delay_s, "dispatched": dispatched, **engine.batch(**columns)}
            rows = self._move(name, batch, actor=actor)
            if not rows:
                continue
            # One statement, one clock reading: every row it stored has the same times.
            created = engine.at(self._run("CREATED_AT", {"id": rows[0][0]})[0][0][0])
            later = created + dt.timedelta(seconds=delay_s)
            key_of = {p.message_id: p.ordering_key for p in chunk}
            stored.update({mid: (pk, created, None if key_of[mid] else later) for pk, mid in rows})
        existing = stored_rows(
            self.engine, self.using, [p.message_id for p in prepared if p.message_id not in stored]
        )
        existing.update(
            self.stored_again(
                [p for p in prepared if p.message_id not in stored], existing, delay_s, actor, dispatched
            )
        )
        result = []
        for p in prepared:
            if p.message_id in stored:
                pk, created, available = stored[p.message_id]
                result.append(
                    materialize(p, pk, created, available, created if dispatched else None, self.using)
                )
            else:
                result.append(existing_match(self.using, p, existing.get(p.message_id)))
        keys = {(p.queue_name, p.ordering_key) for p in prepared if p.ordering_key and p.message_id in stored}
        if keys:
            self._promote_after_commit(
                keys, [p.message_id for p in prepared if p.ordering_key and p.message_id in stored]
            )
        return result

    def _store_one(
        self, p: _Prepared, delay_s: float, actor: str, dispatched: bool, conn: BaseDatabaseWrapper
    ) -> Message:
        """One message (persist_message, send): scalar parameters, and none of the batch's
        bookkeeping. (The array form costs about 70 us more client CPU for one row: psycopg
        dumps lists in Python.)"""
        engine = engine_for(conn)
        params = {
            "mid": p.message_id,
            "queue": p.queue_name,
            "payload": p.encoded,
            "checksum": p.checksum,
            "max_attempts": p.max_attempts,
            "priority": p.priority,
            "key": p.ordering_key,
            "delay": delay_s,
            "dispatched": dispatched,
        }
        name = "INSERT_ONE"
        if p.headers is not None:  # (a statement of its own: without headers, nothing changes)
            name = "INSERT_ONE_HEADERS"
            params["headers"] = p.headers
        rows = self._move(name, params, actor=actor, conn=conn)
        if not rows:  # the id existed
            existing = stored_rows(self.engine, self.using, [p.message_id])
            again = self.stored_again([p], existing, delay_s, actor, dispatched)
            return again.get(p.message_id) or existing_match(self.using, p, existing.get(p.message_id))
        pk, created, available = rows[0]
        created_at = engine.at(created)
        # Undelayed and unordered, it became available when it was stored: one conversion.
        available_at = created_at if available == created else engine.to_datetime(available)
        message = materialize(p, pk, created_at, available_at, created_at if dispatched else None, self.using)
        if p.ordering_key:
            self._promote_after_commit({(p.queue_name, p.ordering_key)}, [p.message_id])
        return message

    def stored_again(
        self,
        refused: Sequence[_Prepared],
        existing: dict[str, Message],
        delay_s: float,
        actor: str,
        dispatched: bool,
    ) -> dict[str, Message]:
        """Of ids whose key refused them, those whose key belongs to a dropped period still
        being cleaned up (no message holds it: :func:`.partition_drops.free_stale_keys`) stored
        again, as a resend after a row-by-row purge is."""
        gone = [p for p in refused if p.message_id not in existing]
        if not gone:
            return {}
        freed = set(partition_drops.free_stale_keys(self.connection, [p.message_id for p in gone]))
        if not freed:
            return {}
        again = self._store([p for p in gone if p.message_id in freed], delay_s, actor, dispatched)
        return {m.message_id: m for m in again}
