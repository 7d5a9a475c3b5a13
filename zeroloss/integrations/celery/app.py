"""Which Celery app publishes: the project's, or nothing is sent.

Celery falls back, silently, to an app of its own ("default": AMQP on localhost) whenever no app
was made the default, which is what happens when the project's ``proj/celery.py`` is never
imported (``proj/__init__.py`` without ``from .celery import app as celery_app``). Publishing
through it would leave every message waiting for the sweep on a broker nobody consumes. So
:func:`project_app` refuses that app, and an app whose broker is not the one the settings
configure (``CELERY_BROKER_URL``): :func:`zeroloss.send` before it stores anything, and the
system check ``zeroloss.E070`` at start-up, with the same words.

Nothing here creates an app: Celery's fallback is created by reading ``current_app``, so the
state is read without it (a fallback created by a check would then stay the default).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error

from ...core.doc_pages import see
from ...core.setting_values import SettingError
from ...core.settings import parse_settings
from ...exceptions import CeleryAppNotConfigured

#: The snippet that loads the project's app when Django starts (Celery's own Django guide).
INIT_IMPORT = "from .celery import app as celery_app"

#: Where Celery's own app sends when it has no broker setting.
CELERY_DEFAULT_BROKER = "amqp://guest@localhost//"


def _loaded_app() -> Any:
    """The app ``current_app`` would give in this thread, or None when it would create Celery's."""
    from celery import _state  # deferred: celery is optional

    state: Any = _state  # the stubs leave out the module's state
    return state._tls.current_app or state.default_app


def _is_celerys_own(app: Any) -> bool:
    # Celery's fallback: Celery("default", fixups=[], set_as_current=False); a project's app has
    # Celery's builtin fixups (Django's among them).
    return getattr(app, "main", None) == "default" and not getattr(app, "fixups", None)


def _safe(url: Any) -> str:
    from kombu.utils.url import maybe_sanitize_url  # deferred: kombu comes with celery, which is optional

    return str(maybe_sanitize_url(url)) if isinstance(url, str) else repr(url)


def app_problem(app: Any) -> str | None:
    """Why publishing through ``app`` would not reach the project's broker; None when it would."""
    if app is None or _is_celerys_own(app):
        return (
            "ZEROLOSS['TRANSPORT'] is 'celery', but the project's Celery app is not loaded in this "
            f"process: messages would be published through Celery's own default app ({CELERY_DEFAULT_BROKER}), "
            "not your broker, and wait for the sweep. Load it when Django starts: in the package that "
            f"holds settings.py and celery.py (proj/), put `{INIT_IMPORT}` in __init__.py "
            f"({see('celery', 'Configuration')})."
        )
    configured = getattr(settings, "CELERY_BROKER_URL", None)
    if configured:
        actual = app.conf.broker_url or CELERY_DEFAULT_BROKER
        if actual != configured:
            return (
                f"ZEROLOSS['TRANSPORT'] is 'celery', but the loaded Celery app {app.main!r} publishes to "
                f"{_safe(actual)}, not to CELERY_BROKER_URL ({_safe(configured)}): it does not read "
                "Django's settings. In proj/celery.py call "
                "app.config_from_object('django.conf:settings', namespace='CELERY') (or give both the same URL)."
            )
    return None


def project_app(*, sending: bool = False) -> Any:
    """The app to publish through; :class:`CeleryAppNotConfigured` when it is not the project's
    (``sending``: raised by :func:`zeroloss.send`, before it stores anything)."""
    app = _loaded_app()
    problem = app_problem(app)
    if problem is not None:
        raise CeleryAppNotConfigured(f"{problem} Nothing was stored." if sending else problem)
    return app


def check_celery_app(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """zeroloss.E070: ``TRANSPORT = "celery"`` and the loaded app is not the project's (as above)."""

    try:
        transport = parse_settings(getattr(settings, "ZEROLOSS", None)).TRANSPORT
    except SettingError:
        return []  # reported by zeroloss.E001-E003
    if transport != "celery":
        return []
    problem = app_problem(_loaded_app())
    if problem is None:
        return []
    return [
        Error(
            problem,
            hint=(
                f"proj/__init__.py: {INIT_IMPORT}"
                if "not loaded" in problem
                else "proj/celery.py: app.config_from_object('django.conf:settings', namespace='CELERY')"
            ),
            obj="settings.ZEROLOSS",
            id="zeroloss.E070",
        )
    ]
