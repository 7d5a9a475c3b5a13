"""Schedules in the admin: database schedules added, edited, enabled, disabled, run now and
previewed; ``ZEROLOSS["SCHEDULES"]`` shown read-only beside them (docs/schedules.md)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.html import format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..core.durations import format_duration
from ..ledger.service import ZeroLossMessageService
from ..runtime.schedules.models import Schedule
from ..runtime.schedules.overdue import overdue_schedules
from ..runtime.schedules.scheduler import Scheduler
from ..runtime.schedules.spec import ScheduleError, ScheduleSpec, parse_schedule, settings_schedules
from ..runtime.schedules.ticks import next_ticks
from ..runtime.transports import ledger_aliases

PREVIEW_COUNT = 5
#: The schedule keys that are model fields of the same name (the form's error goes on it).
_FIELD_OF_KEY = {
    "queue": "queue",
    "task": "task",
    "cron": "cron",
    "every": "every",
    "timezone": "timezone",
    "payload": "payload",
    "args": "args",
    "kwargs": "kwargs",
    "priority": "priority",
    "ordering_key": "ordering_key",
    "enabled": "enabled",
    "catch_up": "catch_up",
    "max_catch_up": "max_catch_up",
    "overlap": "overlap",
}


def _now() -> Any:

    return ZeroLossMessageService().database_now()


class ScheduleForm(forms.ModelForm):
    """Validates exactly as the system checks do; each error on the field it is about."""

    class Meta:
        model = Schedule
        fields = [
            "name",
            "enabled",
            "queue",
            "payload",
            "task",
            "args",
            "kwargs",
            "cron",
            "every",
            "timezone",
            "priority",
            "ordering_key",
            "catch_up",
            "max_catch_up",
            "overlap",
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        name = data.get("name", "")
        try:
            taken = name in settings_schedules(check_targets=False)
        except ScheduleError:
            taken = False
        if taken:
            self.add_error("name", _("ZEROLOSS['SCHEDULES'] already defines a schedule of this name."))
            return data
        row = Schedule(**{k: v for k, v in data.items() if k in {f.name for f in Schedule._meta.fields}})
        try:
            parse_schedule(name, row.as_raw(), source="database")
        except ScheduleError as exc:
            target = _FIELD_OF_KEY.get(exc.field)
            if exc.field == "*" or target is None:
                target = "name" if exc.check_id == "zeroloss.E050" else None
            self.add_error(target, exc.message)
        return data


def _preview(spec: ScheduleSpec) -> SafeString:
    ticks = next_ticks(spec, _now(), PREVIEW_COUNT)
    return format_html_join(
        "",
        "<div>{} <span class='help'>({})</span></div>",
        ((t.isoformat(), t.astimezone(spec.tz).isoformat()) for t in ticks),
    )


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = ("name", "enabled", "target", "when", "next_tick", "catch_up", "overlap", "updated_at")
    list_filter = ("enabled", "catch_up", "overlap")
    search_fields = ("name", "queue", "task")
    readonly_fields = ("next_runs",)
    actions = ["enable", "disable", "run_now"]
    change_list_template = "zeroloss/admin/schedule_change_list.html"

    @staticmethod
    def _spec(obj: Schedule) -> ScheduleSpec | None:
        try:
            return parse_schedule(obj.name, obj.as_raw(), source="database", check_targets=False)
        except ScheduleError:
            return None

    @admin.display(description=_("target"))
    def target(self, obj: Schedule) -> str:
        return obj.task or obj.queue

    @admin.display(description=_("when"))
    def when(self, obj: Schedule) -> str:
        spec = self._spec(obj)
        return spec.when if spec else str(_("invalid"))

    @admin.display(description=_("next tick (UTC)"))
    def next_tick(self, obj: Schedule) -> str:
        spec = self._spec(obj)
        if spec is None or not obj.enabled:
            return "-"
        return next_ticks(spec, _now(), 1)[0].isoformat()

    @admin.display(description=_("next runs"))
    def next_runs(self, obj: Schedule) -> SafeString | str:
        spec = self._spec(obj) if obj.pk else None
        return _preview(spec) if spec else "-"

    @admin.action(description=_("Enable selected schedules"), permissions=["change"])
    def enable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for row in queryset:  # its revision bumped: running schedulers notice
            row.set_enabled(True)
        self.message_user(request, _("Enabled %d schedule(s).") % len(queryset), messages.SUCCESS)

    @admin.action(description=_("Disable selected schedules"), permissions=["change"])
    def disable(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for row in queryset:
            row.set_enabled(False)
        self.message_user(request, _("Disabled %d schedule(s).") % len(queryset), messages.SUCCESS)

    @admin.action(description=_("Run selected schedules now"), permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:

        scheduler = Scheduler()
        sent = []
        for row in queryset:
            try:
                sent.append(scheduler.run_now(row.name))
            except (KeyError, ScheduleError) as exc:
                self.message_user(request, f"{row.name}: {exc}", messages.ERROR)
        if sent:
            self.message_user(request, _("Sent %s.") % ", ".join(sent), messages.SUCCESS)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        rows = []
        try:
            specs = settings_schedules(check_targets=False)
            error = ""
        except ScheduleError as exc:
            specs, error = {}, str(exc)
        now = _now()
        for spec in specs.values():
            upcoming = next_ticks(spec, now, 1) if spec.enabled else []
            rows.append(
                {
                    "name": spec.name,
                    "enabled": spec.enabled,
                    "target": spec.task or spec.queue,
                    "when": spec.when,
                    "next_tick": upcoming[0].isoformat() if upcoming else "-",
                    "catch_up": spec.catch_up,
                    "overlap": spec.overlap,
                }
            )

        overdue = [
            {**o.as_dict(), "late": format_duration(o.late)}
            for alias in ledger_aliases()
            for o in overdue_schedules(alias, now)
        ]
        context = {
            **(extra_context or {}),
            "settings_schedules": rows,
            "settings_error": error,
            "overdue_schedules": overdue,
        }
        return super().changelist_view(request, extra_context=context)
