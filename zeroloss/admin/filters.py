"""Sidebar filters that never scan the ledger: lease state, ordering state, priority, queue,
audit reason, status."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import connections, router
from django.db.models import Model, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from ..core.states import ACTIVE_STATUSES
from ..ledger import statements_reads
from ..ledger.base import engine_for
from ..ledger.models import Message, MessageEvent, Status
from .base import cache_get, cache_set, get_service

#: A value filter (queue, reason) lists at most this many values.
MAX_CHOICES = 500


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


class OrderingStateFilter(admin.SimpleListFilter):
    """Messages of ordering keys: each key's head (claimable or processing), or waiting behind it."""

    title = _("ordering key")
    parameter_name = "ordering"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("head", str(_("Head of its key"))), ("behind", str(_("Behind its key's head")))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == "head":
            # The one-head index's own condition.
            return queryset.filter(status__in=ACTIVE_STATUSES, available_at__isnull=False).exclude(
                ordering_key=""
            )
        if value == "behind":
            return queryset.filter(status=Status.PENDING, available_at__isnull=True)
        return queryset


class PriorityFilter(admin.SimpleListFilter):
    """Priority bands: claims take higher priority first (-100..100, 0 by default)."""

    title = _("priority")
    parameter_name = "priority"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("high", str(_("High (above 0)"))),
            ("normal", str(_("Normal (0)"))),
            ("low", str(_("Low (below 0)"))),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value == "high":
            return queryset.filter(priority__gt=0)
        if value == "normal":
            return queryset.filter(priority=0)
        if value == "low":
            return queryset.filter(priority__lt=0)
        return queryset


def distinct_values(model: type[Model], field: str, limit: int) -> list[str]:
    """The distinct values of an indexed column, in order, without reading every row.

    A recursive walk (a "loose index scan"): each step asks the index for the smallest value
    above the previous one, so it costs one index probe per distinct value: a handful for
    queue names or audit reasons, where ``SELECT DISTINCT`` reads the whole table. Needs an
    index that starts with the column (``(queue_name, status)``, ``(reason, created_at)``).
    """
    db = router.db_for_read(model)
    quote = connections[db].ops.quote_name
    column_name = model._meta.get_field(field).column  # type: ignore[union-attr]
    assert column_name is not None
    table, column = quote(model._meta.db_table), quote(column_name)
    conn = connections[db]
    rows, _ = engine_for(conn).execute(conn, statements_reads.distinct_walk(table, column), [limit])
    return [row[0] for row in rows]


class CachedValuesFilter(admin.SimpleListFilter):
    """A filter on one indexed column whose choices are its distinct values (cached, guarded)."""

    model: type[Model]
    field: str
    limit = MAX_CHOICES

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        timeout = get_service().settings.CACHE_TIMEOUT
        key = f"zeroloss:admin:values:{self.model._meta.label_lower}.{self.field}"
        names: list[str] | None = cache_get(key) if timeout else None
        if names is None:
            names = distinct_values(self.model, self.field, self.limit)
            if timeout:
                cache_set(key, names, timeout)
        return [(n, n) for n in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if not value:
            return queryset
        if "\x00" in value:  # PostgreSQL cannot even compare it: no row can match
            return queryset.none()
        return queryset.filter(**{self.field: value})


class QueueFilter(CachedValuesFilter):
    title = _("queue")
    parameter_name = "queue"
    model = Message
    field = "queue_name"


class ReasonFilter(CachedValuesFilter):
    title = _("reason")
    parameter_name = "reason"
    model = MessageEvent
    field = "reason"


class ToStatusFilter(admin.SimpleListFilter):
    """The statuses are a closed set: no query at all."""

    title = _("to status")
    parameter_name = "to_status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(str(s.value), str(s.label)) for s in Status]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        return queryset.filter(to_status=value) if value else queryset
