"""Where messages go: the options of a queue declared in ``QUEUES``, and the kinds of value of
the settings that route queues to databases and the sweep to a Celery queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from ..exceptions import InvalidMessage
from .names import validate_queue_name
from .rates import Rate, parse_concurrency, parse_rate
from .setting_values import Kind, SettingError, is_printable, limit, retention, setting, specs


@dataclass(frozen=True)
class QueueSettings:
    """One queue declared in ``ZEROLOSS["QUEUES"]``: ``{"emails": {}}``.

    A declared queue may be sent to by a process that does not import its handler (a web image
    without the workers' code); ``zeroloss_worker`` refuses to run one it has no handler for.
    Its options are this class's fields, declared like the settings: adding one is a field. The
    limits (docs/control.md) may be overridden at run time by ``zeroloss_queue limit``."""

    concurrency: int | None = setting(
        None,
        limit(parse_concurrency, "an integer from 1"),
        "At most this many messages of the queue processing at once, across every worker.",
        check_id="zeroloss.E007",
    )
    rate: Rate | None = setting(
        None,
        limit(parse_rate, '`"N/s"`, `"N/m"`, `"N/h"`'),
        "At most this many claims started per period, across every worker.",
        check_id="zeroloss.E007",
    )
    retention: dict[str, float | None] | None = setting(
        None,
        retention(fill=False),
        "How long this queue's finished messages are kept, by status (those it names; the others as "
        "`RETENTION` says).",
        check_id="zeroloss.E008",
    )


#: The options a declared queue accepts, by name: each parses ``(key, value)`` to its typed value.
QUEUE_OPTIONS = specs(QueueSettings)


def _queues(key: str, value: Any, check_id: str) -> dict[str, QueueSettings]:
    if not isinstance(value, dict):
        raise SettingError(
            key, f'must be a dict of queue name -> options, e.g. {{"emails": {{}}}}, got {value!r}.', check_id
        )
    queues: dict[str, QueueSettings] = {}
    for name, options in value.items():
        try:
            validate_queue_name(name)
        except InvalidMessage as exc:
            raise SettingError(key, str(exc), check_id) from None
        where = f"{key}[{name!r}]"
        if not isinstance(options, dict):
            raise SettingError(
                where, f"must be a dict of options ({{}} for none), got {options!r}.", check_id
            )
        unknown = sorted(set(options) - set(QUEUE_OPTIONS), key=str)
        if unknown:
            known = ", ".join(sorted(QUEUE_OPTIONS)) or "none yet"
            raise SettingError(where, f"unknown option {unknown[0]!r}; known options: {known}.", check_id)
        queues[name] = QueueSettings(
            **{k: QUEUE_OPTIONS[k].parse(f"{where}[{k!r}]", v) for k, v in options.items()}
        )
    return queues


QUEUES = Kind(_queues, f"dict of queue name → dict of options ({', '.join(f'`{o}`' for o in QUEUE_OPTIONS)})")


def _queue_databases(key: str, value: Any, check_id: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(q, str) and q and isinstance(a, str) and a for q, a in value.items()
    ):
        raise SettingError(key, f"must be a dict of queue name -> database alias, got {value!r}.", check_id)
    return dict(value)


QUEUE_DATABASES = Kind(_queue_databases, "dict of queue name → database alias")


def _ledger_databases(key: str, value: Any, check_id: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not value or not all(isinstance(a, str) and a for a in value):
        raise SettingError(key, f"must be a non-empty list of database aliases, got {value!r}.", check_id)
    # An alias DATABASES does not define would fail only when the sweep reaches it.
    unknown_aliases = [a for a in value if a not in settings.DATABASES]
    if unknown_aliases:
        raise SettingError(
            key, f"names {unknown_aliases!r}, not in DATABASES ({', '.join(settings.DATABASES)}).", check_id
        )
    return tuple(value)


LEDGER_DATABASES = Kind(_ledger_databases, "non-empty list of aliases")


def _celery_queue_name(key: str, value: Any, check_id: str) -> str | None:
    if value is not None and (
        not isinstance(value, str) or not value.strip() or not is_printable(value) or len(value) > 255
    ):
        raise SettingError(
            key,
            f"must be a Celery queue name (printable, at most 255 characters) or None, got {value!r}.",
            check_id,
        )
    return value


CELERY_QUEUE_NAME = Kind(_celery_queue_name, "a Celery queue name or `None`")
