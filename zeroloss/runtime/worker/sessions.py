"""Dead peers detected on both ends: the keepalives of a worker process's database sessions.

A worker that is cut off or whose host died sends no FIN: without keepalives PostgreSQL keeps
its session, its open transaction and every row lock in it for as long as the system's TCP
defaults say (two hours and more), and the worker waits as long for an answer that will not
come. ``DEAD_PEER_TIMEOUT`` bounds both:

- **on the server**, every session of the process sets ``tcp_keepalives_idle``,
  ``tcp_keepalives_interval``, ``tcp_keepalives_count`` and ``tcp_user_timeout`` for itself,
  so that PostgreSQL ends a silent session, and rolls its transaction back, within the bound;
- **on the client**, a PostgreSQL database whose ``OPTIONS`` name no keepalive of their own
  gets libpq's ``keepalives``, ``keepalives_idle``, ``keepalives_interval``,
  ``keepalives_count`` and ``tcp_user_timeout`` with the same values.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from ...ledger import statements_ops
from ...ledger.base import engine_for

#: libpq's connection parameters that say how a dead server is detected.
CLIENT_KEEPALIVE_OPTIONS = (
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
)

_lock = threading.Lock()
_hardened: dict[str, float] = {}


def keepalive_values(timeout: float) -> dict[str, int]:
    """Keepalive idle, interval and count, and the user timeout (ms), detecting a silent peer
    within ``timeout`` seconds: idle for half of it, then three probes a sixth apart."""
    idle = max(1, math.floor(timeout / 2))
    interval = max(1, math.floor(timeout / 6))
    return {"idle": idle, "interval": interval, "count": 3, "user_timeout_ms": int(timeout * 1000)}


def _on_connection_created(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    timeout = _hardened.get(connection.alias)
    if timeout is None:
        return
    engine = engine_for(connection)
    if not engine.is_server:
        return
    values = keepalive_values(timeout)
    params = {
        "idle": str(values["idle"]),
        "interval": str(values["interval"]),
        "count": str(values["count"]),
        "user_timeout": str(values["user_timeout_ms"]),
    }
    engine.run(connection, statements_ops, "KEEPALIVES", params)


def harden_sessions(aliases: Iterable[str], timeout: float | None) -> None:
    """Make this process's sessions of ``aliases`` detect a dead peer within ``timeout``
    seconds on both ends (None: leave them as configured). Sessions open already keep their
    settings until they reconnect."""
    if timeout is None:
        return
    values = keepalive_values(timeout)
    with _lock:
        for alias in aliases:
            settings_dict = connections.settings[alias]
            if not settings_dict.get("ENGINE", "").endswith("postgresql"):
                continue
            options = settings_dict.setdefault("OPTIONS", {})
            if not any(key in options for key in CLIENT_KEEPALIVE_OPTIONS):
                options.update(
                    keepalives=1,
                    keepalives_idle=values["idle"],
                    keepalives_interval=values["interval"],
                    keepalives_count=values["count"],
                    tcp_user_timeout=values["user_timeout_ms"],
                )
            _hardened[alias] = timeout
        connection_created.connect(_on_connection_created, dispatch_uid="zeroloss.worker.sessions")


__all__ = ["CLIENT_KEEPALIVE_OPTIONS", "harden_sessions", "keepalive_values"]
