"""Settings of the idle benchmark's worker (benchmarks/idle.py): the example project, and a count
of the worker's own statements and transactions, written every second to the file named by
``ZEROLOSS_BENCH_IDLE_COUNTS`` (one JSON line: time, statements, transactions).

A transaction is a statement run outside ``atomic`` (autocommit: its own) or the commit of an
outermost ``atomic``: on SQLite, which has no ``pg_stat_database``, that is the figure."""

import json
import os
import threading
import time
from typing import Any

from django.db.backends.signals import connection_created

from project.settings import *  # noqa: F403

_COUNTS = {"statements": 0, "transactions": 0}
_LOCK = threading.Lock()


def _count(execute: Any, sql: str, params: Any, many: bool, context: dict[str, Any]) -> Any:
    with _LOCK:
        _COUNTS["statements"] += 1
        if not context["connection"].in_atomic_block:
            _COUNTS["transactions"] += 1
    return execute(sql, params, many, context)


def _counted(sender: Any, connection: Any, **kwargs: Any) -> None:
    connection.execute_wrappers.append(_count)
    commit = connection.commit

    def counted_commit() -> None:
        with _LOCK:
            _COUNTS["transactions"] += 1
        commit()

    connection.commit = counted_commit


def _write(path: str) -> None:
    while True:
        with _LOCK:
            line = json.dumps({"t": time.time(), **_COUNTS})
        with open(path, "a") as f:
            f.write(line + "\n")
        time.sleep(1.0)


if os.environ.get("ZEROLOSS_BENCH_IDLE_COUNTS"):
    connection_created.connect(_counted, dispatch_uid="zeroloss.bench.idle")
    threading.Thread(target=_write, args=(os.environ["ZEROLOSS_BENCH_IDLE_COUNTS"],), daemon=True).start()
