"""The message table's named filters (``Message.objects.pending()``, ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db import models
from django.db.models.functions import Now

from ..core.states import Status

if TYPE_CHECKING:
    from .models import Message  # noqa: F401  (the queryset's type argument, a string)


class MessageQuerySet(models.QuerySet["Message"]):
    def pending(self) -> MessageQuerySet:
        return self.filter(status=Status.PENDING)

    def ready(self) -> MessageQuerySet:
        """Pending and claimable now (database clock)."""
        return self.filter(status=Status.PENDING, available_at__lte=Now())

    def processing(self) -> MessageQuerySet:
        return self.filter(status=Status.PROCESSING)

    def stuck(self) -> MessageQuerySet:
        """Processing with an expired lease: the sweep will requeue them."""
        return self.filter(status=Status.PROCESSING, lease_expires_at__lt=Now())

    def leased(self) -> MessageQuerySet:
        """Processing under a live lease."""
        return self.filter(status=Status.PROCESSING, lease_expires_at__gte=Now())

    def completed(self) -> MessageQuerySet:
        return self.filter(status=Status.COMPLETED)

    def dead(self) -> MessageQuerySet:
        return self.filter(status=Status.DEAD)

    def cancelled(self) -> MessageQuerySet:
        return self.filter(status=Status.CANCELLED)
