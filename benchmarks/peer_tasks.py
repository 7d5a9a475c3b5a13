"""The peers' no-op tasks (imported by the peers' workers, after Django is set up)."""

from __future__ import annotations

try:
    from django.tasks import task  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # Django 5.2: the backport
    from django_tasks import task  # type: ignore[no-redef,unused-ignore]


@task()
def noop() -> None:
    """django-tasks-db's no-op task."""


def noop_q() -> None:
    """django-q2's no-op task (a plain function, by dotted path)."""
