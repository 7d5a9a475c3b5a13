"""Celery beat wiring that is safe to import from a project's ``celery.py``.

It touches no model, so it works before Django's app registry is ready::

    from zeroloss.schedule import beat_schedule_entry

    app.conf.beat_schedule = {**app.conf.beat_schedule, **beat_schedule_entry()}

One entry helper, so beat cannot run the sweep and silently not the schedules: the sweep's
entry brings the scheduler's with it (``schedules=False`` leaves it out, for a project that
runs its schedulers elsewhere: ``zeroloss_schedule --loop`` or the database worker).
"""

from __future__ import annotations

from typing import Any

from ...core.settings import get_settings


def beat_schedule_entry(
    interval: float | None = None, *, queue: str | None = None, schedules: bool = True
) -> dict[str, dict[str, Any]]:
    """The ``beat_schedule`` entries that run the sweep every ``SWEEP_INTERVAL`` seconds (or
    ``interval``) and, unless ``schedules=False``, a scheduler round every ``SCHEDULE_INTERVAL``
    seconds (:func:`scheduler_beat_entry`, on the same ``queue``).

    It goes to its own queue (``SWEEP_QUEUE``, default ``zeroloss.sweep``) so deliveries queued
    ahead of it cannot delay it; a worker must consume that queue (``-Q celery,zeroloss.sweep``).
    It has no expiry: an expiry is judged by each worker's clock, which a skewed host defeats,
    and a late sweep is harmless (an extra sweep finds nothing to do).
    """

    settings = get_settings()
    seconds = interval if interval is not None else settings.SWEEP_INTERVAL
    options: dict[str, Any] = {}
    target = queue if queue is not None else settings.SWEEP_QUEUE
    if target:
        options["queue"] = target
    entries = {"zeroloss-sweep": {"task": "zeroloss.sweep", "schedule": seconds, "options": options}}
    return {**entries, **scheduler_beat_entry(queue=queue)} if schedules else entries


def scheduler_beat_entry(
    interval: float | None = None, *, queue: str | None = None
) -> dict[str, dict[str, Any]]:
    """The ``beat_schedule`` entry that runs a scheduler round (``ZEROLOSS["SCHEDULES"]`` and the
    database schedules, docs/schedules.md) every ``SCHEDULE_INTERVAL`` seconds.

    Beat only says "run a round now": which ticks are due is decided by the database clock and
    each tick's message id is ``<name>@<tick UTC>``, so two beats, a late beat or a skewed beat
    host send each tick once. Like the sweep's, it goes to ``SWEEP_QUEUE`` by default.
    """

    settings = get_settings()
    seconds = interval if interval is not None else settings.SCHEDULE_INTERVAL
    options: dict[str, Any] = {}
    target = queue if queue is not None else settings.SWEEP_QUEUE
    if target:
        options["queue"] = target
    return {"zeroloss-schedule": {"task": "zeroloss.schedule", "schedule": seconds, "options": options}}
