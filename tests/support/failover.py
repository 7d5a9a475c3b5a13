"""zeroloss processes against a multi-host (failover) database: their environment, the
``manage.py`` runs, workers and the producer child, and waits that ride out the switch-over.

This module is also the producer: ``python -m tests.support.failover ROLE JSON_ARGS``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from tests.support import ROOT
from tests.support.processes import Proc
from tests.support.waiting import wait_for

QUEUE = "demo.record_tx"
#: Megabytes of filler a lagging standby has yet to replay.
FILLER_MB = 24


def zeroloss_env(
    database: dict[str, Any], zeroloss: dict[str, Any] | None = None, **extra: str
) -> dict[str, str]:
    """Environment of a child process whose Django ``default`` database is ``database``.

    ``DJANGO_DEBUG=0``: with DEBUG on, Django logs every query and zeroloss then never
    prepares statements, which would hide what ``PREPARED_STATEMENTS`` does.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEROLOSS_", "DATABASE_URL"))}
    env.update(
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        DJANGO_SETTINGS_MODULE="project.settings",
        DJANGO_DEBUG="0",
        ZEROLOSS_DATABASE_JSON=json.dumps(database),
        ZEROLOSS_SETTINGS_JSON=json.dumps(zeroloss or {}),
        ZEROLOSS_LOG_LEVEL="INFO",
    )
    env.update(extra)
    return env


def worker(env: dict[str, str], *extra: str) -> Proc:
    return Proc(
        [sys.executable, "manage.py", "zeroloss_worker", "--queue", QUEUE, "--poll-interval", "0.1", *extra],
        env,
    )


def producer(env: dict[str, str], prefix: str, stop_file: Path, pace: float = 0.01) -> Proc:
    args = {"prefix": prefix, "queue": QUEUE, "stop_file": str(stop_file), "pace": pace}
    return Proc([sys.executable, "-m", "tests.support.failover", "produce", json.dumps(args)], env)


def wait_reachable(what: str, timeout: float, check: Callable[[], object], interval: float = 0.1) -> None:
    """Until ``check()`` is truthy, a database error (the switch-over) counting as not yet."""
    last: list[psycopg.Error] = []

    def ready() -> bool:
        try:
            return bool(check())
        except psycopg.Error as exc:
            last[:] = [exc]
            return False

    wait_for(lambda: f"{what} (last error: {last[0] if last else None})", ready, timeout, interval)


def ledger(conn: psycopg.Connection[Any]) -> dict[str, tuple[str, int]]:
    """message_id -> (status, handler effects) for every message of the queue."""
    rows = conn.execute(
        "SELECT m.message_id, m.status, (SELECT count(*) FROM demo_handledrecord h "
        "WHERE h.message_id = m.message_id) FROM zeroloss_message m WHERE m.queue_name = %s",
        [QUEUE],
    ).fetchall()
    return {str(r[0]): (str(r[1]), int(r[2])) for r in rows}


def _emit(**data: Any) -> None:
    print(json.dumps(data, default=str), flush=True)


def _produce(args: dict[str, Any]) -> None:
    """Send until the stop file appears (or ``max`` sends); log every attempt; retry a refused
    id until it is accepted."""
    from django.db import connection

    import zeroloss
    from zeroloss.core.outage import close_connection, is_outage
    from zeroloss.ledger.models import Message

    stop = Path(args.get("stop_file") or "/nonexistent/stop-file")
    most = args.get("max")
    n = 0
    while not stop.exists() and (most is None or n < most):
        n += 1
        message_id = f"{args['prefix']}-{n}"
        attempt = 0
        refused = accepted = False
        while not accepted:
            attempt += 1
            try:
                existed = refused and Message.objects.filter(message_id=message_id).exists()
                zeroloss.send(args["queue"], {"n": n}, message_id=message_id)
                accepted = True
            except Exception as exc:
                if not is_outage(exc):
                    raise
                close_connection("default")
                refused = True
                _emit(id=message_id, outcome="refused", attempt=attempt, t=time.time(), error=str(exc)[:200])
            if accepted:
                port = connection.connection.info.port if connection.connection is not None else None
                _emit(
                    id=message_id,
                    outcome="accepted",
                    attempt=attempt,
                    t=time.time(),
                    existed_before=existed,
                    port=port,
                )
            time.sleep(args.get("pace", 0.01) if accepted else 0.1)  # the send rate; a refusal's retry pace
    _emit(done=True, sent=n)


def _status() -> None:
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError
    from django.db import connection

    from zeroloss.ledger.service import ZeroLossMessageService

    out = io.StringIO()
    # exit code 1 (raised by call_command) when the requirement is not met: the JSON says why
    with contextlib.suppress(CommandError):
        call_command("zeroloss_nodes", "discover", "--json", stdout=out)
    status = ZeroLossMessageService().replication_status(record=False)
    with connection.cursor() as cursor:
        cursor.execute("SELECT inet_server_port(), pg_is_in_recovery()")
        port, recovery = cursor.fetchone()
    _emit(
        port=port,
        in_recovery=recovery,
        confirmed=status.confirmed,
        required=status.required,
        confirmed_by=status.confirmed_by,
        detail=status.detail,
        nodes=json.loads(out.getvalue()),
    )


def main() -> None:
    role, args = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    if role == "produce":
        _produce(args)
    elif role == "status":
        _status()
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
