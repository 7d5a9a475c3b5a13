"""Public path of zeroloss as Django's task backend (``"BACKEND": "zeroloss.tasks_backend.ZeroLossBackend"``,
docs/django-tasks.md): defined in :mod:`zeroloss.integrations.tasks_backend`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .integrations import tasks_backend as _backend

__all__ = ["InvalidTask", "InvalidTaskArguments", "ZeroLossBackend", "ZeroLossTask"]

if TYPE_CHECKING:
    from .integrations.tasks_backend.backend import (
        InvalidTask,
        InvalidTaskArguments,
        ZeroLossBackend,
        ZeroLossTask,
    )


def __getattr__(name: str) -> Any:
    # Read on use, as the backend's package does: only these names need the Tasks framework.
    if name in __all__:
        return getattr(_backend, name)
    raise AttributeError(f"module 'zeroloss.tasks_backend' has no attribute {name!r}")
