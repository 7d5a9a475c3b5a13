"""The service's operations renamed in 0.3, under their old names: each warns, then runs the new one.

One verb per action (docs/upgrading.md lists old -> new); the old names go in 0.4.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

from .surface import P, R, operation

__all__ = ["RENAMED", "deprecated"]

#: Old name -> new name, for the service's methods; what docs/upgrading.md tabulates.
RENAMED = {
    "claim_next": "claim",
    "mark_processing": "claim_message",
    "acknowledge_message": "acknowledge",
    "mark_failed": "fail",
    "release_lease": "release",
    "complete": "record_outcomes",
    "recover_orphaned_messages": "sweep",
    "retry_message": "redrive_or_requeue",
}


class deprecated(operation[P, R]):
    """A renamed operation under its old name (a key of :data:`RENAMED`)."""

    def __set_name__(self, owner: type, name: str) -> None:
        if name not in RENAMED:
            raise TypeError(f"{name} is no renamed operation (zeroloss.ledger.deprecated.RENAMED)")
        self.name = name

    def bind(self, service: Any) -> Callable[P, R]:
        """A function that warns, then runs the new name's method (not kept: each call warns)."""
        old, new, method, part = self.name, RENAMED[self.name], self.method, self.part

        def warned(*args: P.args, **kwargs: P.kwargs) -> R:
            warnings.warn(
                f"ZeroLossMessageService.{old}() is deprecated and will be removed in zeroloss 0.4; "
                f"use {new}().",
                DeprecationWarning,
                stacklevel=2,  # the caller's line: a "default" filter shows it once per call site
            )
            return method(getattr(service, part), *args, **kwargs)

        warned.__name__ = warned.__qualname__ = old
        warned.__doc__ = f"Deprecated: :meth:`{new}`."
        unbound = inspect.signature(method)
        warned.__signature__ = unbound.replace(parameters=list(unbound.parameters.values())[1:])  # type: ignore[attr-defined]
        return warned
