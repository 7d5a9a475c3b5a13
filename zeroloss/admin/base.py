"""What every zeroloss admin shares: the service it acts through, permissions, the read-only
base classes, and a cache that may fail without taking a page down."""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import admin
from django.core.cache import cache
from django.http import HttpRequest

from ..ledger.service import ZeroLossMessageService

logger = logging.getLogger("zeroloss.admin")

#: Custom permissions (``Message.Meta.permissions``), by the action name that needs them.
PERMISSIONS = {
    "requeue": "zeroloss.requeue_message",
    "force_requeue": "zeroloss.force_requeue_message",
    "redrive": "zeroloss.redrive_message",
    "deadletter": "zeroloss.deadletter_message",
    "purge": "zeroloss.purge_message",
    "cancel": "zeroloss.cancel_message",
    "abort": "zeroloss.abort_message",
}


def get_service() -> ZeroLossMessageService:
    """The service the admin acts through (a fresh, cheap instance per request)."""
    return ZeroLossMessageService(instance_id="admin")


def actor(request: HttpRequest) -> str:
    """Who is acting: the operator's user name, recorded in every audit row."""
    return request.user.get_username()


class ReadOnlyAdmin(admin.ModelAdmin):
    """The ledger is never edited through a form: every change is a service action."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class MessagePermissions(ReadOnlyAdmin):
    """View for operators; each action needs its own permission (``@admin.action(permissions=...)``
    asks for ``has_<name>_permission``)."""

    def _has(self, request: HttpRequest, action: str) -> bool:
        return bool(request.user.has_perm(PERMISSIONS[action]))

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "requeue")

    def has_force_requeue_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "force_requeue")

    def has_redrive_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "redrive")

    def has_deadletter_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "deadletter")

    def has_purge_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "purge")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "cancel")

    def has_abort_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "abort")

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # An operator allowed any action may see what it acts on.
        return super().has_view_permission(request, obj) or any(
            request.user.has_perm(p) for p in PERMISSIONS.values()
        )


# The admin's cache only saves work (queue names, the dashboard snapshot); nothing that
# decides a transition reads it. So a cache that fails (Redis down) is logged and bypassed.


def cache_get(key: str) -> Any:
    """``cache.get(key)``, or ``None`` when the cache fails."""
    try:
        return cache.get(key)
    except Exception:
        logger.warning("zeroloss admin: cache read of %s failed; reading the database", key, exc_info=True)
        return None


def cache_set(key: str, value: Any, timeout: float) -> None:
    """``cache.set(...)``; a failing cache is logged and otherwise ignored."""
    try:
        cache.set(key, value, timeout)
    except Exception:
        logger.warning("zeroloss admin: cache write of %s failed", key, exc_info=True)
