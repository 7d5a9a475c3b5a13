"""Celery over the real Redis broker for the transport tests: the broker's URL, pointing this
process's Celery app at a broker, and what the ``broker`` fixture (tests/conftest.py) sets up."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import redis

from project.celery import app as celery_app

REDIS_URL = os.environ.get("ZEROLOSS_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def use_broker(url: str) -> None:
    """Point this process's Celery app at ``url``, dropping pooled connections to the old one."""
    # What ``conf.broker_url = url`` does at run time (the stubs declare a read-only property).
    celery_app.conf["broker_url"] = url
    # Private pools, reset so the next publish connects to ``url``; celery-stubs leave them out.
    celery_app._pool = None  # type: ignore[attr-defined]
    celery_app.amqp._producer_pool = None  # type: ignore[attr-defined]


@contextlib.contextmanager
def celery_over_redis(settings: Any) -> Iterator[redis.Redis]:
    """Celery over the real Redis broker (a dedicated database index, emptied first)."""
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    settings.ZEROLOSS = {**settings.ZEROLOSS, "TRANSPORT": "celery"}
    old = celery_app.conf.broker_url
    use_broker(REDIS_URL)
    try:
        yield client
    finally:
        use_broker(old)
        client.flushdb()
        client.close()
