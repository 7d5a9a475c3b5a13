"""Public path of the errors a handler's run records (docs/async.md): defined in
:mod:`zeroloss.runtime.processing`."""

from .runtime.processing import Delivery, HandlerTimedOut, LeaseLost, ReturnedAwaitable

__all__ = ["Delivery", "HandlerTimedOut", "LeaseLost", "ReturnedAwaitable"]
