"""The ``ZEROLOSS`` setting: one typed object whose attributes are the defaults.

Projects set a dict in their Django settings::

    ZEROLOSS = {"ACK_TIMEOUT": 30, "MAX_ATTEMPTS": 5}

:func:`get_settings` validates it and returns a frozen :class:`ZeroLossSettings`.
Invalid values raise :class:`~django.core.exceptions.ImproperlyConfigured` at use and
are reported by ``manage.py check`` with stable ids (see :mod:`zeroloss.ops.checks`).

Each setting is declared once, in the section of ``docs/settings.md`` it belongs to
(:mod:`.settings_delivery`, :mod:`.settings_storage`): its type, default, validation, check id
and help text. Parsing, the checks and the docs' tables are read from those declarations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .setting_values import DEFAULT_RETENTION, SettingError, Spec, parse_json_encoder, specs
from .settings_delivery import LeaseSettings, OutcomeSettings, SweepSettings
from .settings_storage import HealthSettings, LimitSettings, ReplicationSettings, ScheduleSettings
from .states import Status


@dataclass(frozen=True)
class ZeroLossSettings(  # the last base's fields come first: the docs' order
    ScheduleSettings,
    HealthSettings,
    LimitSettings,
    ReplicationSettings,
    SweepSettings,
    OutcomeSettings,
    LeaseSettings,
):
    """Every zeroloss setting, with its default. Units are seconds unless named otherwise."""

    @property
    def heartbeat_interval(self) -> float:
        return self.HEARTBEAT_INTERVAL if self.HEARTBEAT_INTERVAL is not None else self.ACK_TIMEOUT / 3

    def retention_of(self, queue: str | None = None) -> dict[str, float | None]:
        """How long ``queue``'s finished messages are kept, by status (None: every queue without
        its own ``retention``)."""
        declared = self.QUEUES.get(queue) if queue is not None else None
        own = declared.retention if declared is not None else None
        return {**self.RETENTION, **own} if own else dict(self.RETENTION)


#: The sections of ``docs/settings.md``: each heading's table lists its class's settings.
SECTIONS: dict[str, type] = {
    "Leases and retries": LeaseSettings,
    "Outcomes and outages": OutcomeSettings,
    "The sweep and the transport": SweepSettings,
    "Persistence and replication": ReplicationSettings,
    "Limits, retention, performance": LimitSettings,
    "Health thresholds": HealthSettings,
    "Periodic messages": ScheduleSettings,
}
#: Every setting's declaration, by name.
SETTINGS: dict[str, Spec] = specs(ZeroLossSettings)


def parse_settings(raw: Any) -> ZeroLossSettings:
    """Validate a raw ``ZEROLOSS`` value; raise :class:`SettingError` on the first bad entry."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SettingError("*", f"ZEROLOSS must be a dict, got {type(raw).__name__}.", "zeroloss.E001")
    unknown = sorted(set(raw) - set(SETTINGS))
    if unknown:
        raise SettingError(
            unknown[0], f"unknown setting; known settings are {', '.join(sorted(SETTINGS))}.", "zeroloss.E002"
        )
    values = {key: SETTINGS[key].parse(key, value) for key, value in raw.items()}
    if "RETENTION" not in values:
        # A project that set the older settings keeps what they said.
        values["RETENTION"] = {
            **DEFAULT_RETENTION,
            **(
                {Status.COMPLETED.value: values["COMPLETED_RETENTION"]}
                if "COMPLETED_RETENTION" in values
                else {}
            ),
            **(
                {Status.DEAD.value: values["DEAD_LETTER_RETENTION"]}
                if "DEAD_LETTER_RETENTION" in values
                else {}
            ),
        }
    return ZeroLossSettings(**values)


def settings_table_markdown(section: str) -> str:
    """One section's settings as ``docs/settings.md`` shows them (a test keeps the docs equal)."""
    defaults = ZeroLossSettings()
    lines = ["| setting | default | unit | valid | effect |", "| --- | --- | --- | --- | --- |"]
    for name, spec in specs(SECTIONS[section]).items():
        unit = spec.kind.unit if spec.unit is None else spec.unit
        cells = [f"`{name}`", _shown(getattr(defaults, name), spec), unit, spec.kind.valid, spec.help]
        lines.append("|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|")
    return "\n".join(lines)


def _shown(default: Any, spec: Spec) -> str:
    if spec.shown is not None:
        return spec.shown
    text = f'`"{default}"`' if isinstance(default, str) else f"`{default!r}`"
    return f"{text} ({spec.note})" if spec.note else text


_cached: ZeroLossSettings | None = None
#: ``JSON_ENCODER().default``, once looked up: (found, callable or None).
_json_default: tuple[bool, Any] = (False, None)


def json_default() -> Any:
    """The configured encoder's ``default`` method, or None (no ``JSON_ENCODER``): what
    canonical JSON asks for a value JSON has no type for."""
    global _json_default
    found, default = _json_default
    if not found:
        path = get_settings().JSON_ENCODER
        default = None if path is None else parse_json_encoder("JSON_ENCODER", path)().default
        _json_default = (True, default)
    return default


def get_settings() -> ZeroLossSettings:
    """The validated settings; raises ImproperlyConfigured when ``ZEROLOSS`` is invalid."""
    global _cached
    if _cached is None:
        _cached = parse_settings(getattr(settings, "ZEROLOSS", None))
    return _cached


@receiver(setting_changed)
def _reset_cache(*, setting: str, **kwargs: Any) -> None:
    global _cached, _json_default
    if setting == "ZEROLOSS":
        _cached = None
        _json_default = (False, None)
