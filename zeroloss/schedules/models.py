"""Schedules defined in the database (edited in the admin), and each schedule's progress."""

from __future__ import annotations

from typing import Any

from django.db import models

from .spec import CATCH_UP, DEFAULT_MAX_CATCH_UP, OVERLAP


class Schedule(models.Model):
    """A schedule beside ``ZEROLOSS["SCHEDULES"]``, with the same keys (docs/schedules.md).
    Running schedulers notice an add, edit or delete within one ``SCHEDULE_INTERVAL``."""

    name = models.CharField(max_length=200, unique=True, help_text="Tick message ids are <name>@<tick UTC>.")
    queue = models.CharField(max_length=100, blank=True, default="", help_text="A zeroloss handler's queue.")
    task = models.CharField(
        max_length=255, blank=True, default="", help_text="Or a Django task's import path (not both)."
    )
    cron = models.CharField(max_length=255, blank=True, default="", help_text="Five fields, e.g. 0 3 * * *.")
    every = models.FloatField(null=True, blank=True, help_text="Or seconds between ticks, from the epoch.")
    timezone = models.CharField(
        max_length=64, blank=True, default="", help_text="IANA name; empty: TIME_ZONE."
    )
    payload = models.JSONField(null=True, blank=True)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    priority = models.SmallIntegerField(default=0)
    ordering_key = models.CharField(max_length=255, blank=True, default="")
    enabled = models.BooleanField(default=True)
    catch_up = models.CharField(max_length=8, choices=[(c, c) for c in CATCH_UP], default="latest")
    max_catch_up = models.PositiveIntegerField(default=DEFAULT_MAX_CATCH_UP)
    overlap = models.CharField(max_length=8, choices=[(o, o) for o in OVERLAP], default="allow")
    created_at = models.DateTimeField(auto_now_add=True)
    #: Schedulers compare count and latest ``updated_at`` each round to notice a change.
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "zeroloss"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def as_raw(self) -> dict[str, Any]:
        """The schedule as a ``SCHEDULES`` entry (what :func:`~.spec.parse_schedule` reads)."""
        raw: dict[str, Any] = {
            "priority": self.priority,
            "ordering_key": self.ordering_key,
            "enabled": self.enabled,
            "catch_up": self.catch_up,
            "max_catch_up": self.max_catch_up,
            "overlap": self.overlap,
        }
        if self.queue:
            raw["queue"] = self.queue
            raw["payload"] = self.payload
        if self.task:
            raw["task"] = self.task
            raw["args"] = self.args if self.args is not None else []
            raw["kwargs"] = self.kwargs if self.kwargs is not None else {}
        if self.cron:
            raw["cron"] = self.cron
        if self.every is not None:
            raw["every"] = self.every
        if self.timezone:
            raw["timezone"] = self.timezone
        return raw


class ScheduleState(models.Model):
    """How far a schedule got: every tick up to ``last_tick`` was sent or deliberately not (catch-up
    policy, overlap); ``last_sent`` is the newest tick whose message was inserted. Written in the
    transaction that inserts the tick messages, under a row lock, so schedulers agree on it."""

    name = models.CharField(max_length=200, primary_key=True)
    last_tick = models.DateTimeField(null=True, blank=True)
    last_sent = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "zeroloss"

    def __str__(self) -> str:
        return f"{self.name} @ {self.last_tick}"
