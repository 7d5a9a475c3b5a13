"""``manage.py zeroloss_verify``: integrity of the messages and conservation of the ledger.

Integrity, per message (all of them, or ``--sample N`` chosen at random): the payload
still hashes to its checksum, attempts within ``max_attempts``, the lease is not expired
(stuck), and with ``--replication`` the message's commit is *measured* on enough standbys.

Conservation, set-based over the whole ledger (or ``--queue``), each count in one SQL
statement so concurrent transitions never make it disagree with itself:

- every audit row belongs to an existing message (purges delete both together);
- every message has exactly one ``persisted`` event;
- each message's status is the ``to_status`` of its latest event (over the sample with
  ``--sample``);
- persisted = pending + processing + completed + dead + purged, where *persisted* is the
  ``persisted`` events still present plus the messages counted by purge records.

Workflows (docs/workflows.md): no step left ``waiting`` when every dependency settled (stranded:
a warning, the sweep releases it), none released while a dependency is unsettled (critical).

Plus: dead letters above ``HEALTH_MAX_DEAD`` and the replication requirement.

Severity comes from each issue's code (:data:`zeroloss.management.verify.SEVERITY`), never from
its text. Nothing is
written: ``--replication`` measures with ``replication_status(message, record=False)``, against
the message's recorded commit position or, when none was recorded, the current WAL position.

Memory is bounded by bytes, not rows: ids and payload sizes are read first (no payloads), then
full rows in batches of at most ``BATCH_PAYLOAD_BYTES`` (32 MiB) of payload JSON text and
2,000 rows (:mod:`zeroloss.management.batches`); a payload larger than that is fetched alone.

``--verbosity 0`` prints the verdict and the issues only; 2 adds how the run went (batches,
largest batch, seconds per phase).

Exit codes (a monitor can page on them): 0 OK; 1 warning (stuck messages, stranded workflow
steps, dead letters above ``HEALTH_MAX_DEAD``); 2 critical (checksum mismatch, attempts beyond
max, any conservation discrepancy, a step released early, insufficient replication,
replication requirement unmet) or bad
arguments; 4 the ledger could not be reached. JSON schema: docs/operations.md.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop, pgettext

from ..base import EXIT_CRITICAL, EXIT_WARNING, CriticalFound, WarningFound, ZeroLossCommand, positive_int
from ..batches import BATCH_PAYLOAD_BYTES
from ..verify import Verification


class Command(ZeroLossCommand):
    help = gettext_noop(
        "Verify message integrity (checksums, stuck leases, attempts, replication) and the "
        "conservation of the ledger. Exit code 0 OK, 1 warning, 2 critical."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            help=_("Only this queue (orphan audit rows are checked ledger-wide; default: every queue)."),
        )
        parser.add_argument(
            "--sample",
            type=positive_int,
            metavar="N",
            help=_("Check the integrity of N random messages (default: every message)."),
        )
        parser.add_argument(
            "--replication",
            action="store_true",
            help=_("Also measure each checked message's copies on the standbys (PostgreSQL)."),
        )
        parser.add_argument(
            "--max-issues",
            type=positive_int,
            default=100,
            help=_("List at most this many issues (all are counted; default: %(default)s)."),
        )

    def handle(
        self,
        *,
        queue: str | None,
        sample: int | None,
        replication: bool,
        max_issues: int,
        json: bool,
        **options: Any,
    ) -> None:
        service = self.service(options)
        queue = self.check_queue(service, queue)
        checks = Verification(service, queue, max_issues=max_issues)
        now = service.database_now()

        began = time.perf_counter()
        integrity, checked_pks = checks.integrity(
            sample,
            replication,
            lambda total: self.progress(total, pgettext("a progress bar's label", "verify"), {"json": json}),
        )
        integrity_seconds = time.perf_counter() - began
        conservation = checks.conservation(checked_pks if sample else None)
        dead_letters = checks.dead_letters()
        workflows = checks.workflows()
        replication_result = checks.replication()

        status, code = checks.verdict()
        total = sum(checks.issue_counts.values())
        result: dict[str, Any] = {
            "status": status,
            "exit_code": code,
            "database": service.using,
            "queue": queue,
            "checked_at": now.isoformat(),
            "integrity": integrity,
            "conservation": conservation,
            "dead_letters": dead_letters,
            "workflows": workflows,
            "replication": replication_result,
            "issue_counts": dict(sorted(checks.issue_counts.items())),
            "issues": [i.as_dict() for i in checks.issues],
            "issues_total": total,
            "issues_truncated": total > len(checks.issues),
        }
        self.report(result, [i.text for i in checks.issues], as_json=json)
        self.log(
            _(
                "zeroloss_verify: integrity %(integrity)ss in %(batches)s batch(es), largest "
                "%(largest)s MiB of payload (bound %(bound)s MiB); conservation and the rest %(rest)ss"
            )
            % {
                "integrity": f"{integrity_seconds:.2f}",
                "batches": checks.fetched.count,
                "largest": f"{checks.fetched.largest / 2**20:.1f}",
                "bound": f"{BATCH_PAYLOAD_BYTES / 2**20:.0f}",
                "rest": f"{time.perf_counter() - began - integrity_seconds:.2f}",
            },
            level=2,
        )
        if code == EXIT_CRITICAL:
            raise CriticalFound(_("zeroloss_verify: critical: %(total)s issue(s)") % {"total": total})
        if code == EXIT_WARNING:
            raise WarningFound(_("zeroloss_verify: warning: %(total)s issue(s)") % {"total": total})

    # -- output -------------------------------------------------------------------------

    def report(self, result: dict[str, Any], texts: list[str], *, as_json: bool) -> None:
        """``texts``: each listed issue's detail in the active language (``--json`` has English)."""
        if as_json:
            self.emit_json(result)
            return
        self.stdout.write(f"zeroloss_verify: {result['status'].upper()}")
        if self.verbosity >= 1:
            self.summary(result)
        if result["issues"]:
            self.stdout.write("")
            self.table(
                [_("severity"), _("check"), "message_id", _("detail")],
                [
                    [x["severity"], x["check"], x["message_id"] or "-", text]
                    for x, text in zip(result["issues"], texts, strict=True)
                ],
            )
            if result["issues_truncated"]:
                self.stdout.write(
                    _("... %(count)s more (raise --max-issues)")
                    % {"count": result["issues_total"] - len(result["issues"])}
                )

    def summary(self, result: dict[str, Any]) -> None:
        c = result["conservation"]
        i = result["integrity"]
        line = _("integrity: %(count)s message(s) checked") % {"count": i["messages_checked"]}
        if i["sampled"]:
            line += _(" (random sample)")
        if i["replication_checked"]:
            line += _(", replication measured")
        self.stdout.write(line)
        balance = (
            _("balanced")
            if c["balanced"]
            else _("NOT BALANCED (accounted %(accounted)s)") % {"accounted": c["accounted"]}
        )
        self.stdout.write(
            _(
                "conservation: %(persisted)s persisted = %(pending)s pending + %(processing)s processing + "
                "%(completed)s completed + %(dead)s dead + %(purged)s purged -> %(balance)s"
            )
            % {**c, "balance": balance}
        )
        rep = result["replication"]
        self.stdout.write(
            _("replication requirement: %(met)s (%(available)s streaming, %(required)s required)")
            % {
                "met": _("met") if rep["ok"] else _("NOT MET"),
                "available": rep["available"],
                "required": rep["required"],
            }
        )
        if result["issue_counts"]:
            self.stdout.write("")
            self.table([_("check"), _("issues")], sorted(result["issue_counts"].items()))
