"""The changelist's sidebar filters beyond the model fields: lease state and queue."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from ..models import Message, Status
from .base import cache_get, cache_set, get_service

#: Cache key of the queue names the queue filter offers.
QUEUES_CACHE_KEY = "zeroloss:admin:queues"
#: The queue filter lists at most this many queue names.
MAX_QUEUES = 500


class LeaseStateFilter(admin.SimpleListFilter):
    title = _("lease")
    parameter_name = "lease"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("stuck", str(_("Expired (stuck)"))),
            ("live", str(_("Live"))),
            ("none", str(_("No lease"))),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == "stuck":
            return queryset.filter(status=Status.PROCESSING, lease_expires_at__lt=Now())
        if value == "live":
            return queryset.filter(status=Status.PROCESSING, lease_expires_at__gte=Now())
        if value == "none":
            return queryset.filter(lease_expires_at__isnull=True)
        return queryset


class QueueFilter(admin.SimpleListFilter):
    title = _("queue")
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        timeout = get_service().settings.CACHE_TIMEOUT
        names: list[str] | None = cache_get(QUEUES_CACHE_KEY) if timeout else None
        if names is None:
            names = list(
                Message.objects.order_by("queue_name")
                .values_list("queue_name", flat=True)
                .distinct()[:MAX_QUEUES]
            )
            if timeout:
                cache_set(QUEUES_CACHE_KEY, names, timeout)
        return [(n, n) for n in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        return queryset.filter(queue_name=value) if value else queryset
