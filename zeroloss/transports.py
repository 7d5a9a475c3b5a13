"""Public path of sending (docs/reference/sending.md; also ``zeroloss.send``): defined in
:mod:`zeroloss.runtime.transports`."""

from .runtime.transports import asend, send, send_many

__all__ = ["asend", "send", "send_many"]
