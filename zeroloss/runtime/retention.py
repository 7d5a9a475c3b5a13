"""Retention without cron: the workers' maintenance removes the finished messages past
``RETENTION`` (docs/settings.md#retention).

Every process that sweeps (``zeroloss_worker``, ``zeroloss_sweep``, Celery beat's
``zeroloss.sweep``) asks after its sweep, at most every ``CHECK_EVERY`` seconds, whether it is
the deployment's turn (:class:`~zeroloss.models.MaintenanceTurn`, by the database clock): one
process at a time takes it, at most every ``RETENTION_EVERY`` seconds across the deployment.
Taking the turn is one statement on the sweep's connection; the turn then runs in a thread of
its own, with a connection of its own while it runs, so that the sweep never waits for it (a
partition's detach waits for the transactions older than it), for at most ``RUN_FOR`` seconds
of batches; what is left goes to the next turn, due at once. What it removes is audited as a purge
(``PurgeRecord`` rows, actor ``retention@<instance>``): :meth:`.Operator.apply_retention`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from django.db import connections

from ..ledger import statements_ops

logger = logging.getLogger("zeroloss")

#: The turn's name in ``zeroloss_maintenance``.
TURN = "retention"
#: How often a sweeping process asks whether the turn is due (seconds): one statement.
CHECK_EVERY = 60.0
#: How often the deployment runs retention (seconds), whoever runs it.
RETENTION_EVERY = 300.0
#: Seconds of batches a turn runs at most; the rest goes to the next turn.
RUN_FOR = 20.0
#: A turn is held this long (then left due ``RETENTION_EVERY`` later): a process gone mid-way
#: loses it then.
HOLD_FOR = 900.0
#: Per database alias: when this process last asked (monotonic), and its turn's thread.
_ASKED: dict[str, float] = {}
_RUNNING: dict[str, threading.Thread] = {}
_LOCK = threading.Lock()


def _keeps_all(service: Any) -> bool:
    cfg = service.settings
    return all(v is None for v in cfg.RETENTION.values()) and not any(
        q.retention for q in cfg.QUEUES.values()
    )


def take_turn(service: Any, holder: str, hold: float = HOLD_FOR) -> bool:
    """Whether ``holder`` took the turn (it was due), for ``hold`` seconds."""
    rows, _ = service.engine.run(
        service.connection, statements_ops, "TAKE_TURN", {"name": TURN, "holder": holder, "hold": hold}
    )
    return bool(rows)


def _due_again(service: Any, holder: str, after: float) -> None:
    service.engine.run(
        service.connection, statements_ops, "HOLD_TURN", {"after": after, "name": TURN, "holder": holder}
    )


def run_turn(service: Any) -> dict[str, int] | None:
    """The turn, here and now, if it is due: the messages removed by status; None when it is
    not due (another process ran it lately, or runs it)."""
    holder = f"{service.instance_id}/{uuid.uuid4().hex[:8]}"
    if not take_turn(service, holder):
        return None
    return _run(service, holder)


def _run(service: Any, holder: str) -> dict[str, int]:
    """The turn ``holder`` took."""
    deadline = time.monotonic() + RUN_FOR
    try:
        removed: dict[str, int] = service.apply_retention(deadline=deadline)
    except BaseException:
        _due_again(service, holder, CHECK_EVERY)
        raise
    # Cut off by its deadline: the rest is due at once (another process, or this one's next ask).
    _due_again(service, holder, 0.0 if time.monotonic() >= deadline else RETENTION_EVERY)
    if any(removed.values()):
        logger.info(
            "retention: removed %s",
            ", ".join(f"{n} {status}" for status, n in removed.items() if n),
        )
    return removed


def after_sweep(service: Any, report: Any) -> Any:
    """The after-sweep hook: once every ``CHECK_EVERY`` seconds, take the turn if it is due
    (one statement, on the sweep's connection) and run it in a thread of its own (with a
    connection of its own, closed when it ends), unless this process runs one already."""
    if _keeps_all(service):
        return report
    alias = service.using
    now = time.monotonic()
    with _LOCK:
        running = _RUNNING.get(alias)
        if now - _ASKED.get(alias, -CHECK_EVERY) < CHECK_EVERY or (
            running is not None and running.is_alive()
        ):
            return report
        _ASKED[alias] = now
    holder = f"{service.instance_id}/{uuid.uuid4().hex[:8]}"
    if not take_turn(service, holder):
        return report
    thread = threading.Thread(
        target=_in_thread,
        args=(type(service), alias, service.instance_id, holder),
        name="zeroloss-retention",
        daemon=True,
    )
    with _LOCK:
        _RUNNING[alias] = thread
    thread.start()
    return report


def join(alias: str, timeout: float | None = None) -> None:
    """Wait for the turn this process runs on ``alias``, if any (a one-shot sweep before it exits)."""
    with _LOCK:
        running = _RUNNING.get(alias)
    if running is not None:
        running.join(timeout)


def _in_thread(service_class: Any, alias: str, instance_id: str, holder: str) -> None:
    try:
        _run(service_class(using=alias, instance_id=instance_id), holder)
    except Exception as exc:  # the next turn tries again; the sweep goes on either way
        logger.warning("zeroloss: retention on %r failed (%s); tried again at the next turn", alias, exc)
    finally:
        connections[alias].close()
