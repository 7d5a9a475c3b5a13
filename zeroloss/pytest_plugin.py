"""zeroloss's pytest plugin (loaded by the ``pytest11`` entry point once zeroloss is installed).

``zeroloss_drain``: :func:`zeroloss.testing.drain`, with pytest-django's ``db`` fixture (the
test runs in a transaction that is rolled back). Nothing here imports Django at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture
def zeroloss_drain(db: None) -> Callable[..., Any]:
    """``zeroloss_drain("emails")`` runs the queue's pending messages now (docs/testing.md)."""
    from .testing import drain  # deferred: pytest loads the plugin before django.setup()

    return drain
