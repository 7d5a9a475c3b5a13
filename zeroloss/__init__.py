"""zeroloss: a durable, leased, audited message ledger for Django and Celery.

The public API is re-exported lazily so that importing ``zeroloss`` never touches Django's
app registry (safe in settings modules and Celery config).
"""

from __future__ import annotations

import importlib
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
    "Workflow",
    "ZeroLossMessageService",
    "asend",
    "cancel",
    "cancel_workflow",
    "chain",
    "chord",
    "group",
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
    from .runtime.workflows import Workflow, cancel_workflow, chain, chord, group


#: Where each public name is defined, imported on first use.
_LAZY = {
    "Aborted": "zeroloss.runtime.delivery",
    "Backoff": "zeroloss.runtime.retry",
    "CancelOutcome": "zeroloss.ledger.cancelling",
    "CancelResult": "zeroloss.ledger.cancelling",
    "ExponentialBackoff": "zeroloss.runtime.retry",
    "Fail": "zeroloss.runtime.retry",
    "FixedBackoff": "zeroloss.runtime.retry",
    "Lease": "zeroloss.ledger.service",
    "RecoveryReport": "zeroloss.ledger.service",
    "Retry": "zeroloss.runtime.retry",
    "Snooze": "zeroloss.runtime.retry",
    "SoftTimeLimitExceeded": "zeroloss.exceptions",
    "Workflow": "zeroloss.runtime.workflows",
    "ZeroLossMessageService": "zeroloss.ledger.service",
    "asend": "zeroloss.runtime.transports",
    "cancel": "zeroloss.ledger.cancelling",
    "cancel_workflow": "zeroloss.runtime.workflows",
    "chain": "zeroloss.runtime.workflows",
    "chord": "zeroloss.runtime.workflows",
    "group": "zeroloss.runtime.workflows",
    "handler": "zeroloss.runtime.handlers",
    "send": "zeroloss.runtime.transports",
    "send_many": "zeroloss.runtime.transports",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'zeroloss' has no attribute {name!r}")
    # Deferred: the service, sending and the handlers need Django's app registry.
    return getattr(importlib.import_module(_LAZY[name]), name)
