"""Each handler plays its message's script: ``{"script": ["snooze", "retry", "ok"], "delay": 1}``.

Run ``n`` of a message (counted by its ``claimed`` audit rows, so a snoozed run counts too)
does ``script[n - 1]`` (the last step again past its end): ``ok`` returns, ``error`` raises
ValueError, ``key`` KeyError, ``conn`` ConnectionError, ``retry`` ``zeroloss.Retry(delay)``,
``snooze`` ``zeroloss.Snooze(delay)``, ``fail`` ``zeroloss.Fail("gone")``.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async

import zeroloss
from zeroloss.ledger.models import MessageEvent
from zeroloss.runtime.processing import Delivery


def step(delivery: Delivery) -> Any:
    payload = delivery.payload
    script = payload["script"]
    runs = MessageEvent.objects.filter(message__message_id=delivery.message_id, reason="claimed").count()
    action = script[min(runs, len(script)) - 1]
    delay = float(payload.get("delay", 0))
    if action == "ok":
        return None
    if action == "retry":
        raise zeroloss.Retry(delay=delay, reason="rate limited")
    if action == "snooze":
        raise zeroloss.Snooze(delay=delay, reason="not ready")
    if action == "fail":
        raise zeroloss.Fail("gone")
    if action == "key":
        raise KeyError("missing")
    if action == "conn":
        raise ConnectionError("refused")
    raise ValueError("boom")


@zeroloss.handler("rp.script")
def script(delivery: Delivery) -> None:
    step(delivery)


@zeroloss.handler("rp.script_async")
async def script_async(delivery: Delivery) -> None:
    await sync_to_async(step)(delivery)


@zeroloss.handler("rp.script_tx", transactional=True)
def script_tx(delivery: Delivery) -> None:
    step(delivery)


@zeroloss.handler("rp.policy", max_attempts=3, backoff=zeroloss.FixedBackoff(0))
def policy(delivery: Delivery) -> None:
    step(delivery)


@zeroloss.handler("rp.plain")
def plain(delivery: Delivery) -> None:
    step(delivery)


@zeroloss.handler(
    "rp.only",
    retry_on=(ConnectionError,),
    dont_retry_on=(KeyError,),
    backoff=zeroloss.ExponentialBackoff(base=0, cap=0),
)
def only(delivery: Delivery) -> None:
    step(delivery)


@zeroloss.handler("rp.slow_backoff", backoff=zeroloss.FixedBackoff(7))
def slow_backoff(delivery: Delivery) -> None:
    step(delivery)
