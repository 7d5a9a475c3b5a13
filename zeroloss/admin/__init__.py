"""The operator's desk: see, requeue, redrive, dead-letter and purge messages, safely.

The admin never writes a ``Message`` or ``MessageEvent`` row itself: every change is an
action that calls :class:`~zeroloss.service.ZeroLossMessageService`, which writes the
transition and its audit row (with the operator's user name as ``actor``) atomically.
Messages are never added or edited through a form.

This module only registers the admins (Django autodiscovers ``zeroloss.admin``); they live
in ``message`` (with ``display``, ``actions``, ``filters``, ``search`` and ``views``),
``ledger`` and ``workflows``; ``base`` and ``paginator`` hold what they share.
"""

from __future__ import annotations

from django.contrib import admin

from ..ledger.models import Message, MessageEvent, PurgeRecord, ReplicationNode, Workflow
from .base import PERMISSIONS, ReadOnlyAdmin, get_service
from .ledger import MessageEventAdmin, PurgeRecordAdmin, ReplicationNodeAdmin
from .message import MessageAdmin
from .paginator import LedgerPaginator
from .queues import QueueControlAdmin  # registers QueueControl (docs/control.md)
from .schedules import ScheduleAdmin  # registers Schedule (docs/schedules.md)
from .workflows import WorkflowAdmin

admin.site.register(Message, MessageAdmin)
admin.site.register(ReplicationNode, ReplicationNodeAdmin)
admin.site.register(MessageEvent, MessageEventAdmin)
admin.site.register(PurgeRecord, PurgeRecordAdmin)
admin.site.register(Workflow, WorkflowAdmin)

__all__ = [
    "PERMISSIONS",
    "LedgerPaginator",
    "MessageAdmin",
    "MessageEventAdmin",
    "PurgeRecordAdmin",
    "QueueControlAdmin",
    "ReadOnlyAdmin",
    "ReplicationNodeAdmin",
    "ScheduleAdmin",
    "WorkflowAdmin",
    "get_service",
]
