"""The demo's Django task (``django.tasks`` on Django 6, the ``django-tasks`` backport on 5.2).

``TASKS`` in ``project/settings.py`` names zeroloss's backend, so ``.enqueue()`` stores the task
in the ledger in the caller's transaction and ``zeroloss_worker --queue demo.tasks`` runs it,
leased and retried like any handler's message::

    from django.db import transaction
    from project.demo.tasks import send_receipt

    with transaction.atomic():
        order = Order.objects.create(...)
        result = send_receipt.enqueue(order_id=order.pk)   # rolled back with the order
    send_receipt.get_result(result.id).status              # READY, RUNNING, SUCCESSFUL, FAILED
"""

from __future__ import annotations

import os

from zeroloss.integrations.tasks_backend.compat import task

from .models import HandledRecord


@task(queue_name="demo.tasks", priority=10, takes_context=True)
def send_receipt(context, order_id: int) -> dict[str, int | str]:
    """Record the receipt; the return value is stored with the task's result."""
    HandledRecord.objects.create(
        message_id=context.task_result.id, queue_name="demo.tasks", worker=f"{os.getpid()}"
    )
    return {"order_id": order_id, "attempt": context.attempt}
