"""E060: a handler's soft time limit that could never fire (registered by :mod:`zeroloss.ops.checks`)."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error
from django.core.exceptions import ImproperlyConfigured

from ...core.doc_pages import see
from ...core.settings import ZeroLossSettings, get_settings
from ...runtime.handlers import HandlerSpec, get_handler, registered_queues
from ...runtime.timelimits import hard_limit


def limits_messages(specs: list[HandlerSpec], settings: ZeroLossSettings) -> list[CheckMessage]:
    """E060: a soft limit that could never fire before the handler's hard bound."""

    messages: list[CheckMessage] = []
    for spec in specs:
        hard = hard_limit(spec, settings.HANDLER_TIMEOUT)
        if spec.soft_time_limit is not None and hard is not None and spec.soft_time_limit >= hard:
            messages.append(
                Error(
                    f"Handler {spec.name} of queue {spec.queue_name!r} has soft_time_limit "
                    f"{spec.soft_time_limit:g}s, not shorter than its hard bound HANDLER_TIMEOUT "
                    f"({hard:g}s): the soft limit would never fire.",
                    hint="Lower soft_time_limit, raise ZEROLOSS['HANDLER_TIMEOUT'], or give the handler "
                    f"its own time_limit ({see('control', 'Time limits and the process pool')}).",
                    obj=spec.queue_name,
                    id="zeroloss.E060",
                )
            )
    return messages


def check_time_limits(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E060 over every registered handler (registered by :mod:`zeroloss.ops.checks`)."""

    try:
        settings = get_settings()
    except ImproperlyConfigured:
        return []  # E001-E003 report it
    return limits_messages([get_handler(q) for q in registered_queues()], settings)
