"""The service's flat names: each *is* one part's public operation, declared once, written once.

``claim = operation(Leases.claim)`` in the service's class makes ``service.claim`` the method
``Leases.claim`` bound to ``service.leases``: the part's own signature and docstring, for mypy, ``help()`` and
the reference docs alike, with nothing written again in between. The first lookup on a service
stores that bound method on it, so every later call goes straight to the part.
:class:`.deprecated.deprecated` keeps a renamed operation's old name, warning on each call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

__all__ = ["PART_ATTRIBUTES", "from_context", "operation"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

#: The service's attribute for each class whose operations it names (a part, or its context).
PART_ATTRIBUTES = {
    "LedgerContext": "context",
    "Store": "store",
    "Leases": "leases",
    "Outcomes": "outcomes",
    "Aborts": "aborts",
    "Control": "control",
    "Recovery": "recovery",
    "Operator": "operator",
    "Keys": "keys",
    "Dispatch": "dispatch",
    "Reads": "reads",
    "Nodes": "nodes",
}


class operation(Generic[P, R]):
    """The service's name for ``method``, an operation of one part (or of the context)."""

    def __init__(self, method: Callable[Concatenate[Any, P], R]) -> None:
        owner = method.__qualname__.rpartition(".")[0]
        if owner not in PART_ATTRIBUTES:
            raise TypeError(f"{method.__qualname__} is no operation of a part of the ledger")
        self.method = method
        self.part = PART_ATTRIBUTES[owner]
        functools.update_wrapper(self, method)  # type: ignore[arg-type]

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type) -> Callable[Concatenate[Any, P], R]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> Callable[P, R]: ...

    def __get__(self, obj: object | None, owner: type) -> Callable[..., Any]:
        return self.method if obj is None else self.bind(obj)

    def bind(self, service: Any) -> Callable[P, R]:
        """The method bound to ``service``'s part, kept on the service for its later lookups."""
        part = getattr(service, self.part)
        bound: Callable[P, R] = self.method.__get__(part, type(part))
        service.__dict__[self.name] = bound
        return bound


class from_context(Generic[T]):
    """The context's attribute of that name (``connection``, ``engine``), read on every lookup:
    the connection is the current thread's."""

    def __init__(self, name: str, doc: str) -> None:
        self.name, self.__doc__ = name, doc

    @overload
    def __get__(self, obj: None, owner: type) -> from_context[T]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> T: ...

    def __get__(self, obj: object | None, owner: type) -> Any:
        return self if obj is None else getattr(obj.context, self.name)  # type: ignore[attr-defined]
