from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class ZeroLossConfig(AppConfig):
    name = "zeroloss"
    verbose_name = _("zeroloss")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        import logging

        from django.conf import settings

        from . import (
            checks,  # noqa: F401  (registers the system checks)
            replication,
            telemetry,
        )
        from .delivery import OutcomeWaiters
        from .handlers import add_queue_source, autodiscover
        from .ledger import events
        from .ledger.hooks import install_redispatch, install_replication
        from .logs import LOGGER, TraceIds
        from .notices import LogNotices, SignalNotices
        from .service import ZeroLossMessageService
        from .tasks_backend.runner import TASK_QUEUES
        from .telemetry.subscriber import TelemetryEvents
        from .transports.celery import redispatch

        # The ledger calls replication and the transport through its hooks, never by import.
        install_replication(replication.hooks())
        install_redispatch(redispatch)
        # Its side effects subscribe to the ledger's events, in the order each batch reaches them.
        events.subscribe(
            LogNotices(), SignalNotices(ZeroLossMessageService), TelemetryEvents(), OutcomeWaiters()
        )
        events.install_tracer(telemetry)
        logger = logging.getLogger(LOGGER)
        if not any(isinstance(f, TraceIds) for f in logger.filters):
            logger.addFilter(TraceIds())
        add_queue_source(TASK_QUEUES)  # task queues (TASKS) have handlers too
        from .schedules import notify

        notify.connect()  # a schedule saved wakes the listening schedulers
        autodiscover()
        if "django_prometheus" in settings.INSTALLED_APPS:
            from .metrics import register_default

            register_default()
