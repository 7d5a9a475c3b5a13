"""The app's models, where Django looks for them: the ledger's (:mod:`zeroloss.ledger.models`) and
the schedules' (:mod:`zeroloss.runtime.schedules.models`)."""

from .ledger.models import (
    ACTIVE_STATUSES,
    LIVE_STATUSES,
    DedupKey,
    DroppedPeriod,
    MaintenanceTurn,
    Message,
    MessageEvent,
    MessageEventQuerySet,
    MessageKey,
    MessageQuerySet,
    NodeRole,
    OrderingHead,
    PurgeRecord,
    QueueControl,
    RateBucket,
    Reason,
    ReplicationNode,
    Status,
)
from .runtime.schedules.models import Schedule, ScheduleState

__all__ = [
    "ACTIVE_STATUSES",
    "LIVE_STATUSES",
    "DedupKey",
    "DroppedPeriod",
    "MaintenanceTurn",
    "Message",
    "MessageEvent",
    "MessageEventQuerySet",
    "MessageKey",
    "MessageQuerySet",
    "NodeRole",
    "OrderingHead",
    "PurgeRecord",
    "QueueControl",
    "RateBucket",
    "Reason",
    "ReplicationNode",
    "Schedule",
    "ScheduleState",
    "Status",
]
