"""A queue's name: the one rule for the settings, the ledger and the commands."""

from __future__ import annotations

import re
from typing import Any

from ..exceptions import InvalidMessage

MAX_QUEUE_NAME_LENGTH = 100
QUEUE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]*")


def validate_queue_name(queue_name: Any) -> str:
    """``queue_name`` if it is a valid queue name; otherwise :class:`InvalidMessage`."""
    if not isinstance(queue_name, str) or not queue_name:
        raise InvalidMessage(f"queue_name must be a non-empty string, got {queue_name!r}.")
    if len(queue_name) > MAX_QUEUE_NAME_LENGTH:
        raise InvalidMessage(
            f"queue_name is {len(queue_name)} characters; the limit is {MAX_QUEUE_NAME_LENGTH}."
        )
    if not QUEUE_NAME_RE.fullmatch(queue_name):
        raise InvalidMessage(
            f"queue_name {queue_name!r} may only use letters, digits, '_', '.', ':' and '-', "
            "starting with a letter or digit."
        )
    return queue_name
