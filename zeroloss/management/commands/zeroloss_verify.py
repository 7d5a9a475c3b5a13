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

Exit codes (a monitor can page on them): 0 OK; 1 warning (stuck messages, dead letters
above ``HEALTH_MAX_DEAD``); 2 critical (checksum mismatch, attempts beyond max, any
conservation discrepancy, insufficient replication, replication requirement unmet) or bad
arguments; 4 the ledger could not be reached. JSON schema: docs/operations.md.
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import CommandParser

from ..base import EXIT_CRITICAL, EXIT_WARNING, CriticalFound, WarningFound, ZeroLossCommand, positive_int
from ..batches import BATCH_PAYLOAD_BYTES
from ..verify import Verification


class Command(ZeroLossCommand):
    help = (
        "Verify message integrity (checksums, stuck leases, attempts, replication) and the "
        "conservation of the ledger. Exit code 0 OK, 1 warning, 2 critical."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            help="Only this queue (orphan audit rows are checked ledger-wide; default: every queue).",
        )
        parser.add_argument(
            "--sample",
            type=positive_int,
            metavar="N",
            help="Check the integrity of N random messages (default: every message).",
        )
        parser.add_argument(
            "--replication",
            action="store_true",
            help="Also measure each checked message's copies on the standbys (PostgreSQL).",
        )
        parser.add_argument(
            "--max-issues",
            type=positive_int,
            default=100,
            help="List at most this many issues (all are counted; default: %(default)s).",
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
            sample, replication, lambda total: self.progress(total, "verify", {"json": json})
        )
        integrity_seconds = time.perf_counter() - began
        conservation = checks.conservation(checked_pks if sample else None)
        dead_letters = checks.dead_letters()
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
            "replication": replication_result,
            "issue_counts": dict(sorted(checks.issue_counts.items())),
            "issues": [i.as_dict() for i in checks.issues],
            "issues_total": total,
            "issues_truncated": total > len(checks.issues),
        }
        self.report(result, as_json=json)
        self.log(
            f"zeroloss_verify: integrity {integrity_seconds:.2f}s in {checks.fetched.count} batch(es), largest "
            f"{checks.fetched.largest / 2**20:.1f} MiB of payload (bound {BATCH_PAYLOAD_BYTES / 2**20:.0f} MiB); "
            f"conservation and the rest {time.perf_counter() - began - integrity_seconds:.2f}s",
            level=2,
        )
        if code == EXIT_CRITICAL:
            raise CriticalFound(f"zeroloss_verify: critical: {total} issue(s)")
        if code == EXIT_WARNING:
            raise WarningFound(f"zeroloss_verify: warning: {total} issue(s)")

    # -- output -------------------------------------------------------------------------

    def report(self, result: dict[str, Any], *, as_json: bool) -> None:
        if as_json:
            self.emit_json(result)
            return
        self.stdout.write(f"zeroloss_verify: {result['status'].upper()}")
        if self.verbosity >= 1:
            self.summary(result)
        if result["issues"]:
            self.stdout.write("")
            self.table(
                ["severity", "check", "message_id", "detail"],
                [[x["severity"], x["check"], x["message_id"] or "-", x["detail"]] for x in result["issues"]],
            )
            if result["issues_truncated"]:
                self.stdout.write(
                    f"... {result['issues_total'] - len(result['issues'])} more (raise --max-issues)"
                )

    def summary(self, result: dict[str, Any]) -> None:
        c = result["conservation"]
        i = result["integrity"]
        self.stdout.write(
            f"integrity: {i['messages_checked']} message(s) checked"
            + (" (random sample)" if i["sampled"] else "")
            + (", replication measured" if i["replication_checked"] else "")
        )
        self.stdout.write(
            f"conservation: {c['persisted']} persisted = {c['pending']} pending + {c['processing']} processing + "
            f"{c['completed']} completed + {c['dead']} dead + {c['purged']} purged "
            f"-> {'balanced' if c['balanced'] else 'NOT BALANCED (accounted ' + str(c['accounted']) + ')'}"
        )
        rep = result["replication"]
        self.stdout.write(
            f"replication requirement: {'met' if rep['ok'] else 'NOT MET'} "
            f"({rep['available']} streaming, {rep['required']} required)"
        )
        if result["issue_counts"]:
            self.stdout.write("")
            self.table(["check", "issues"], sorted(result["issue_counts"].items()))
