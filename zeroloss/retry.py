"""Public path of a handler's retry policy and outcomes (docs/handlers.md): defined in
:mod:`zeroloss.runtime.retry`."""

from .runtime.retry import Backoff, ExponentialBackoff, Fail, FixedBackoff, HandlerOutcome, Retry, Snooze

__all__ = ["Backoff", "ExponentialBackoff", "Fail", "FixedBackoff", "HandlerOutcome", "Retry", "Snooze"]
