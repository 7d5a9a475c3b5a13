"""Full message rows in batches bounded by payload bytes, not rows (``zeroloss_verify``).

Fetching N rows at a time costs N x the largest payload: 2,000 rows of 200 KiB is 400 MiB of
JSON text before Python parses it. :class:`PayloadBatches` first reads ids and payload sizes
(no payload leaves the database), then fetches full rows in id order in batches holding at
most :data:`BATCH_PAYLOAD_BYTES` of payload JSON text and :data:`BATCH_ROWS` rows. A payload
larger than the bound is fetched alone. Peak memory is then about the bound times what Python
needs per byte of JSON (the text, then the parsed objects), plus the interpreter.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..ledger import statements_ops
from ..ledger.base import engine_for
from ..ledger.models import Message
from ..ledger.service import ZeroLossMessageService

#: Payload JSON text fetched at once, at most (one larger payload is fetched alone).
BATCH_PAYLOAD_BYTES = 32 * 1024 * 1024
#: Rows fetched at once, at most (many small payloads).
BATCH_ROWS = 2000
#: Ids and sizes read per page (no payloads).
SIZE_PAGE = 10_000


class PayloadBatches:
    """Byte-bounded batches of full rows of one database; counts what it fetched."""

    def __init__(self, service: ZeroLossMessageService, *, max_bytes: int = BATCH_PAYLOAD_BYTES) -> None:
        self.service = service
        self.max_bytes = max_bytes
        #: Batches fetched, and the payload bytes of the largest one.
        self.count = 0
        self.largest = 0

    def all_sizes(self, queue: str | None = None) -> Iterator[tuple[int, int]]:
        """(id, payload bytes) of every message (of ``queue``) in id order, a page at a time."""
        conn = self.service.connection
        engine = engine_for(conn)
        name = "PAYLOAD_SIZES_OF_QUEUE" if queue is not None else "PAYLOAD_SIZES"
        last = 0
        while True:
            rows, _ = engine.run(
                conn, statements_ops, name, {"after": last, "queue": queue, "size": SIZE_PAGE}
            )
            page = [(int(pk), int(size or 0)) for pk, size in rows]
            yield from page
            if len(page) < SIZE_PAGE:
                return
            last = page[-1][0]

    def sizes_of(self, pks: list[int]) -> Iterator[tuple[int, int]]:
        """(id, payload bytes) of the messages ``pks`` (sorted ascending), a page at a time."""
        conn = self.service.connection
        engine = engine_for(conn)
        for start in range(0, len(pks), 1000):
            ids = {"ids": engine.column(pks[start : start + 1000])}
            rows, _ = engine.run(conn, statements_ops, "PAYLOAD_SIZES_OF", ids)
            yield from ((int(pk), int(size or 0)) for pk, size in rows)

    def batches(self, sizes: Iterable[tuple[int, int]]) -> Iterator[list[Message]]:
        """Full rows in id order; a message deleted meanwhile (a purge) is simply absent."""
        group: list[int] = []
        group_bytes = 0
        for pk, size in sizes:
            if group and (group_bytes + size > self.max_bytes or len(group) >= BATCH_ROWS):
                yield self._fetch(group, group_bytes)
                group, group_bytes = [], 0
            group.append(pk)
            group_bytes += size
        if group:
            yield self._fetch(group, group_bytes)

    def _fetch(self, pks: list[int], payload_bytes: int) -> list[Message]:
        self.count += 1
        self.largest = max(self.largest, payload_bytes)
        return list(Message.objects.using(self.service.using).filter(pk__in=pks).order_by("id"))
