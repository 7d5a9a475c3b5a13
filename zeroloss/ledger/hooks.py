"""What the ledger calls out to without importing it: replication and transports hang here.

The ledger knows only this registry. :mod:`zeroloss.integrations.replication` and the Celery transport
install their functions here from the app's ``ready()`` (:mod:`zeroloss.apps`), so the
dependency points one way: they import the ledger, never the reverse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from .models import Message, ReplicationNode

__all__ = ["ReplicationHooks", "install_redispatch", "install_replication", "redispatch", "replication"]


@dataclass(frozen=True)
class ReplicationHooks:
    """The replication functions the ledger calls, each taking the service first."""

    #: ``"replicated"`` persistence: wait until enough standbys replayed the stored messages
    #: (after the commit when called inside ``transaction.atomic``).
    confirm: Callable[[Any, Sequence[Message]], None]
    #: Measured copies of a message (``record=False``: write nothing).
    measure: Callable[..., Any]
    register_node: Callable[..., ReplicationNode]
    heartbeat: Callable[[Any, str], bool]
    unregister_node: Callable[[Any, str], bool]
    live_nodes: Callable[[Any], list[ReplicationNode]]
    #: Register (heartbeat) the standbys the primary streams to (the sweep's after-sweep hook).
    discover: Callable[[Any], list[ReplicationNode]]


_installed: list[ReplicationHooks] = []


def install_replication(hooks: ReplicationHooks) -> None:
    """Install (or replace) the replication hooks; idempotent, called from ``ready()``."""
    _installed[:] = [hooks]


def replication() -> ReplicationHooks:
    if not _installed:
        raise ImproperlyConfigured(
            "zeroloss's replication hooks are not installed: add 'zeroloss' to INSTALLED_APPS and "
            "call django.setup() before using the ledger (the app's ready() installs them)."
        )
    return _installed[0]


_redispatch: list[Callable[[Any], list[str]]] = []


def install_redispatch(publish_waiting: Callable[[Any], list[str]]) -> None:
    """Install (or replace) the transport's "publish what no broker message carries"; ``ready()``."""
    _redispatch[:] = [publish_waiting]


def redispatch(service: Any) -> list[str]:
    """Publish the service's undispatched pending messages through the installed transport."""
    if not _redispatch:
        raise ImproperlyConfigured(
            "zeroloss's transport hooks are not installed: add 'zeroloss' to INSTALLED_APPS and "
            "call django.setup() before using the ledger (the app's ready() installs them)."
        )
    return _redispatch[0](service)
