"""Sends the workflow fault run's two workflows (tests/faults/workflows.py) in one transaction:
``python -m tests.faults.workflow_sender '[members, diamonds, member_sleep_ms, diamond_sleep_ms]'``,
in the environment of the run's processes (its database, ``ZEROLOSS_EXTRA_APPS=tests.faults``)."""

from __future__ import annotations

import json
import sys
from typing import Any

import django

django.setup()

from django.db import transaction  # noqa: E402

import zeroloss  # noqa: E402
from tests.faults.workflows import DIAMONDS, GROUP, MAX_ATTEMPTS  # noqa: E402
from tests.faults.zeroloss_handlers import WF_CALLBACK_QUEUE, WF_QUEUE  # noqa: E402


def send(members: int, diamonds: int, member_sleep_ms: float, diamond_sleep_ms: float) -> None:
    """A group of ``members`` steps and its callback; a chain of ``diamonds`` diamonds."""
    with transaction.atomic():
        group = zeroloss.Workflow(GROUP)
        picks = [
            group.step(
                WF_QUEUE, {"n": i, "sleep_ms": member_sleep_ms}, name=f"m{i}", max_attempts=MAX_ATTEMPTS
            )
            for i in range(members)
        ]
        # Its first attempt waits to be SIGKILLed mid-handler (the run does it).
        group.step(
            WF_CALLBACK_QUEUE, {"hang_first": True}, name="callback", after=picks, max_attempts=MAX_ATTEMPTS
        )
        group.send()
        chain = zeroloss.Workflow(DIAMONDS)
        previous: list[Any] = []
        payload = {"sleep_ms": diamond_sleep_ms}
        for i in range(diamonds):
            a = chain.step(WF_QUEUE, payload, name=f"a{i}", after=previous, max_attempts=MAX_ATTEMPTS)
            b = chain.step(WF_QUEUE, payload, name=f"b{i}", after=[a], max_attempts=MAX_ATTEMPTS)
            c = chain.step(WF_QUEUE, payload, name=f"c{i}", after=[a], max_attempts=MAX_ATTEMPTS)
            previous = [chain.step(WF_QUEUE, payload, name=f"d{i}", after=[b, c], max_attempts=MAX_ATTEMPTS)]
        chain.send()


if __name__ == "__main__":
    send(*json.loads(sys.argv[1]))
