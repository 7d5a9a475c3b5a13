"""zeroloss: a durable, leased, audited message ledger for Django and Celery.

The public API is re-exported lazily so that importing ``zeroloss`` never touches Django's
app registry (safe in settings modules and Celery config).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.3.0.dev0"

__all__ = [
    "Aborted",
    "Backoff",
    "CancelOutcome",
    "CancelResult",
    "ExponentialBackoff",
    "Fail",
    "FixedBackoff",
    "Lease",
    "RecoveryReport",
    "Retry",
    "Snooze",
    "SoftTimeLimitExceeded",
    "ZeroLossMessageService",
    "asend",
    "cancel",
    "handler",
    "send",
    "send_many",
]

if TYPE_CHECKING:
    from .exceptions import SoftTimeLimitExceeded
    from .ledger.cancelling import CancelOutcome, CancelResult, cancel
    from .ledger.service import Lease, RecoveryReport, ZeroLossMessageService
    from .runtime.delivery import Aborted
    from .runtime.handlers import handler
    from .runtime.retry import Backoff, ExponentialBackoff, Fail, FixedBackoff, Retry, Snooze
    from .runtime.transports import asend, send, send_many


def __getattr__(name: str) -> Any:
    if name in {"Lease", "RecoveryReport", "ZeroLossMessageService"}:
        from .ledger import service

        return getattr(service, name)
    if name == "SoftTimeLimitExceeded":
        from .exceptions import SoftTimeLimitExceeded

        return SoftTimeLimitExceeded
    if name in {"cancel", "CancelOutcome", "CancelResult"}:
        from .ledger import cancelling

        return getattr(cancelling, name)
    if name in {"Backoff", "ExponentialBackoff", "Fail", "FixedBackoff", "Retry", "Snooze"}:
        from .runtime import retry

        return getattr(retry, name)
    if name == "Aborted":
        from .runtime.delivery import Aborted

        return Aborted
    if name == "handler":
        from .runtime.handlers import handler

        return handler
    if name in {"send", "send_many", "asend"}:
        from .runtime import transports

        return getattr(transports, name)
    raise AttributeError(f"module 'zeroloss' has no attribute {name!r}")
