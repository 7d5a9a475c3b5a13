"""Schedules defined in the database (edited in the admin), and each schedule's progress."""

from __future__ import annotations

from typing import Any

from django.db import models, transaction
from django.db.models import F
from django.db.models.functions import Now

from .spec import CATCH_UP, DEFAULT_MAX_CATCH_UP, OVERLAP, settings_schedules


def _settings_names() -> set[str]:

    try:
        return set(settings_schedules(check_targets=False))
    except Exception:  # a bad settings schedule is the checks' to report, not a save's
        return set()


def _enable_states(using: str, names: list[str]) -> None:
    """Schedules enabled or created now: each starts at the database clock (its first tick is
    the next after it; catch-up covers only time after it)."""
    if names:
        ScheduleState.objects.using(using).bulk_create(
            [ScheduleState(name=n) for n in names], ignore_conflicts=True
        )
        ScheduleState.objects.using(using).filter(name__in=names).update(last_tick=Now(), updated_at=Now())


def _delete_states(using: str, names: list[str]) -> None:
    """A deleted schedule's progress goes with it (one created again under its name starts afresh)."""
    names = sorted(set(names) - _settings_names())
    if names:
        ScheduleState.objects.using(using).filter(name__in=names).delete()


class ScheduleQuerySet(models.QuerySet["Schedule"]):
    """Writes that keep the schedulers' word: every update bumps ``revision`` (what running
    schedulers compare), enabling starts the schedules at the database clock, and a delete takes
    their progress with it."""

    def update(self, **kwargs: Any) -> int:
        kwargs.setdefault("revision", F("revision") + 1)
        with transaction.atomic(using=self.db):
            enabling: list[str] = []
            if kwargs.get("enabled") is True:
                enabling = list(self.filter(enabled=False).values_list("name", flat=True))
            count = super().update(**kwargs)
            _enable_states(self.db, enabling)
        return count

    def delete(self) -> tuple[int, dict[str, int]]:
        with transaction.atomic(using=self.db):
            names = list(self.values_list("name", flat=True))
            deleted = super().delete()
            _delete_states(self.db, names)
        return deleted


class Schedule(models.Model):
    """A schedule beside ``ZEROLOSS["SCHEDULES"]``, with the same keys (docs/schedules.md).
    Running schedulers notice an add, edit or delete within one ``SCHEDULE_INTERVAL``: every
    write bumps ``revision``, which the schedulers compare (not ``updated_at``, the editing
    host's clock). Enabling or creating one starts it at the database clock: its first tick is
    the next after that, never one it missed while disabled or before it existed."""

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
    updated_at = models.DateTimeField(auto_now=True)
    #: Bumped by every write: schedulers compare the sum, the count and the highest id each round.
    revision = models.PositiveBigIntegerField(default=0, editable=False)

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        app_label = "zeroloss"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args: Any, **kwargs: Any) -> None:
        using = kwargs.get("using") or self._state.db or "default"
        update_fields = kwargs.get("update_fields")
        if update_fields is not None:
            kwargs["update_fields"] = {*update_fields, "revision"}
        with transaction.atomic(using=using):
            before = None
            if not self._state.adding and self.pk is not None:
                before = type(self).objects.using(using).filter(pk=self.pk).values("name", "enabled").first()
            if before is not None:
                self.revision = F("revision") + 1
            super().save(*args, **kwargs)
            if before is not None:
                del self.__dict__["revision"]  # deferred: read again when asked for
            renamed = before is not None and before["name"] != self.name
            if renamed and before is not None:
                _delete_states(using, [before["name"]])
            if self.enabled and (before is None or renamed or not before["enabled"]):
                _enable_states(using, [self.name])

    def set_enabled(self, enabled: bool) -> None:
        """Enable or disable it (the admin's actions, ``zeroloss_schedule enable|disable``):
        enabling starts it at the database clock, and the write bumps its revision."""
        self.enabled = enabled
        self.save(update_fields=["enabled", "updated_at"])

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        using = kwargs.get("using") or self._state.db or "default"
        with transaction.atomic(using=using):
            deleted = super().delete(*args, **kwargs)
            _delete_states(using, [self.name])
        return deleted

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
