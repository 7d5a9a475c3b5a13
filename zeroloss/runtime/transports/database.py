"""The built-in transport: workers poll the ledger, woken by PostgreSQL NOTIFY (sent by the insert)."""

from __future__ import annotations

from collections.abc import Sequence

from ...ledger.models import Message
from ...ledger.service import ZeroLossMessageService
from ...ledger.types import RecoveryReport


class DatabaseTransport:
    name = "database"

    def before_send(self, service: ZeroLossMessageService) -> None:
        """Nothing to refuse: the ledger is the transport."""

    def after_commit(self, service: ZeroLossMessageService, messages: Sequence[Message]) -> None:
        """Nothing to publish: the insert's NOTIFY (delivered at commit) wakes idle workers."""

    def after_sweep(self, service: ZeroLossMessageService, report: RecoveryReport) -> RecoveryReport:
        return report
