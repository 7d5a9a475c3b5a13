"""Celery beat wiring that is safe to import from a project's ``celery.py``.

It touches no model, so it works before Django's app registry is ready::

    from zeroloss.schedule import beat_schedule_entry

    app.conf.beat_schedule = {**beat_schedule_entry()}
"""

from __future__ import annotations

from typing import Any


def beat_schedule_entry(interval: float | None = None) -> dict[str, dict[str, Any]]:
    """The ``beat_schedule`` entry that runs the sweep every ``SWEEP_INTERVAL`` seconds."""
    from .conf import get_settings

    seconds = interval if interval is not None else get_settings().SWEEP_INTERVAL
    return {
        "zeroloss-sweep": {"task": "zeroloss.sweep", "schedule": seconds, "options": {"expires": seconds * 2}}
    }
