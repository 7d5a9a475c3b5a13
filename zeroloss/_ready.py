"""What the app's ``ready()`` connects, once Django's app registry is ready: the hooks and the
event subscribers through which a lower layer reaches a higher one, the system checks, the log
filter, the schedules' wake-up, the handlers' autodiscovery."""

from __future__ import annotations

import logging

from django.conf import settings

from .integrations import replication, telemetry
from .integrations.celery.transport import CeleryTransport, redispatch
from .integrations.tasks_backend.runner import TASK_QUEUES
from .integrations.telemetry.subscriber import TelemetryEvents
from .ledger import events
from .ledger.hooks import install_redispatch, install_replication
from .ledger.service import ZeroLossMessageService
from .ops import checks  # noqa: F401  (registers the system checks)
from .ops.logs import LOGGER, TraceIds
from .ops.notices import LogNotices, SignalNotices
from .runtime.delivery import OutcomeWaiters
from .runtime.handlers import add_queue_source, autodiscover
from .runtime.schedules import notify
from .runtime.transports import register_transport


def connect() -> None:
    # The ledger calls replication and the transport through its hooks, never by import.
    install_replication(replication.hooks())
    install_redispatch(redispatch)
    register_transport("celery", CeleryTransport)
    # Its side effects subscribe to the ledger's events, in the order each batch reaches them.
    events.subscribe(LogNotices(), SignalNotices(ZeroLossMessageService), TelemetryEvents(), OutcomeWaiters())
    events.install_tracer(telemetry)
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(f, TraceIds) for f in logger.filters):
        logger.addFilter(TraceIds())
    add_queue_source(TASK_QUEUES)  # task queues (TASKS) have handlers too
    notify.connect()  # a schedule saved wakes the listening schedulers
    autodiscover()
    if "django_prometheus" in settings.INSTALLED_APPS:
        from .ops.metrics import register_default  # deferred: prometheus-client is optional

        register_default()
