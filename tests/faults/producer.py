"""The producer: ``python -m tests.faults.producer JSON`` sends through ``zeroloss.send()`` the whole time.

It chooses every message id itself (``<prefix>-<n>``) and logs every call of ``send`` as one
line, flushed at once (the producer is never killed, so no fsync)::

    <started> <returned> <message_id> <queue> <try> accepted|refused <error class>

(the error class prefixed ``caller:`` when the caller's own connect or COMMIT failed, not
``send()``; suffixed ``!storage`` for a raw error that says the disk refused the write).

``accepted``: ``send`` returned, the message is stored. ``refused``: it raised (the database
was unreachable, the connection died). A refused send may still have committed — the
connection can die after the server committed and before the client heard — so the
producer does what the docs tell a caller to do: it sends the same id with the same payload
again (persisting is idempotent), with a backoff, until one call returns. The checker counts
a message as accepted only from an ``accepted`` line.

SIGTERM ends the sending of new messages; retries of refused ones go on until accepted or
``give_up_after`` seconds.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from collections import deque
from typing import Any

from tests.support.waiting import pause


def _sleep_ms(rng: random.Random, n: int, fast_max: float, slow_every: int) -> float:
    """Handler time: 0-``fast_max`` ms, and every ``slow_every``-th message 500 ms (handlers of
    mixed speed: a worker is then often in the middle of one when a fault lands)."""
    fast = round(rng.uniform(0, fast_max), 1)
    return 500.0 if slow_every and n % slow_every == slow_every - 1 else fast


def _name(exc: BaseException) -> str:
    """The exception's class with its module: Django's OperationalError, not the driver's."""
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def main() -> None:
    args: dict[str, Any] = json.loads(sys.argv[1])
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from django.db import connection, transaction

    from zeroloss.core.outage import is_storage_fault
    from zeroloss.exceptions import StorageFull, ZeroLossError
    from zeroloss.runtime.transports import send

    stopping = False  # SIGTERM: send nothing new, finish the retries
    woken = threading.Event()  # and end the gap being waited out, so that this is seen at once

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        woken.set()

    signal.signal(signal.SIGTERM, on_term)
    rng = random.Random(args["seed"])
    queues: list[str] = args["queues"]
    count: int = args["count"]
    rate: float = args["rate"]
    max_attempts: int = args["max_attempts"]
    sleep_ms_max: float = args.get("sleep_ms_max", 0)
    in_transaction: bool = args.get("in_transaction", False)
    plan = [
        (
            f"{args['prefix']}-{n:06d}",
            rng.choice(queues),
            {
                "n": n,
                "sleep_ms": args.get("sleep_ms", _sleep_ms(rng, n, sleep_ms_max, args.get("slow_every", 0))),
            },
        )
        for n in range(count)
    ]
    retry: deque[tuple[float, int, int]] = deque()  # (due, index in plan, try number)
    first_try: dict[int, float] = {}
    out = open(args["out"], "a", buffering=1)  # noqa: SIM115 - open for the whole run
    started = time.monotonic()
    next_new = accepted = refused = 0
    gave_up: list[str] = []
    while True:
        now = time.monotonic()
        if retry and retry[0][0] <= now:
            _, index, attempt = retry.popleft()
        elif not stopping and next_new < count and now >= started + next_new / rate:
            index, attempt = next_new, 1
            next_new += 1
        elif (stopping or next_new >= count) and not retry:
            break
        else:
            due = [retry[0][0]] if retry else []
            if not stopping and next_new < count:
                due.append(started + next_new / rate)
            if pause(woken, min(due) - now):  # the send schedule: a rate in real time
                woken.clear()  # woken once: the retries' gaps are waited out in full
            continue
        message_id, queue, payload = plan[index]
        first_try.setdefault(index, now)
        t0 = time.time()
        in_send = False  # else the caller's own Django call failed (its connect, its COMMIT)
        try:
            if in_transaction:  # the caller's own transaction: the send commits with it
                with transaction.atomic():
                    in_send = True
                    send(queue, payload, message_id=message_id, max_attempts=max_attempts)
                    in_send = False
            else:
                in_send = True
                send(queue, payload, message_id=message_id, max_attempts=max_attempts)
        except Exception as exc:
            if isinstance(exc, ZeroLossError) and not isinstance(exc, StorageFull):
                # bad input: a bug of this suite, never a fault (a full disk's StorageFull is one)
                out.write(
                    f"{t0:.6f} {time.time():.6f} {message_id} {queue} {attempt} fatal {type(exc).__name__}\n"
                )
                raise
            refused += 1
            # "caller:": the caller's own Django call failed (its connect, its COMMIT), not send();
            # "!storage": a raw error that says the disk refused (send() raises StorageFull for it).
            raw_storage = is_storage_fault(exc) and not isinstance(exc, StorageFull)
            error = ("" if in_send else "caller:") + _name(exc) + ("!storage" if raw_storage else "")
            out.write(f"{t0:.6f} {time.time():.6f} {message_id} {queue} {attempt} refused {error}\n")
            try:
                connection.close()  # a broken connection is not reused (as a request's end would do)
            except Exception:
                connection.connection = None
            if time.monotonic() - first_try[index] > args.get("give_up_after", 120):
                gave_up.append(message_id)
                continue
            backoff = min(0.05 * 2 ** min(attempt, 6), 2.0) * rng.uniform(0.5, 1.0)
            retry.append((time.monotonic() + backoff, index, attempt + 1))
            retry = deque(sorted(retry))
        else:
            accepted += 1
            out.write(f"{t0:.6f} {time.time():.6f} {message_id} {queue} {attempt} accepted -\n")
    out.write(f"# done sent={next_new} accepted={accepted} refused={refused} gave_up={len(gave_up)}\n")
    out.close()


if __name__ == "__main__":
    main()
