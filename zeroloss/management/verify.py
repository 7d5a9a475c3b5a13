"""The checks behind ``manage.py zeroloss_verify``, and the issues they find.

:class:`Verification` runs them over one database (or one queue) and counts every issue by its
code; the command parses the arguments, assembles the JSON and prints. Severity comes from each
issue's code (:data:`SEVERITY`), never from its text. Nothing here writes.

Memory is bounded by bytes, not rows: the integrity pass reads ids and payload sizes first (no
payloads), then full rows through :class:`~zeroloss.management.batches.PayloadBatches`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.models import Count, Exists, F, OuterRef, Q, Subquery
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from ..core.states import ANNOTATIONS, is_allowed
from ..integrations.replication import requirement as replication_requirement
from ..ledger import statements_reads
from ..ledger.base import engine_for
from ..ledger.models import Message, MessageEvent
from ..ledger.service import IntegrityFinding, ZeroLossMessageService
from .base import EXIT_CRITICAL, EXIT_OK, EXIT_WARNING, Progress
from .batches import PayloadBatches

CRITICAL = "critical"
WARNING = "warning"

#: Every issue code and its severity. The verdict (and exit code) is decided from these codes;
#: a code the service adds later keeps the severity its finding carries.
SEVERITY: dict[str, str] = {
    # integrity, per message (ZeroLossMessageService.verify_message's finding codes)
    "checksum_mismatch": CRITICAL,
    "attempts_exceeded": CRITICAL,
    "replication_insufficient": CRITICAL,
    "stuck": WARNING,
    # conservation
    "orphan_event": CRITICAL,
    "missing_persisted_event": CRITICAL,
    "duplicate_persisted_event": CRITICAL,
    "status_mismatch": CRITICAL,
    "unbalanced": CRITICAL,
    "disallowed_transition": CRITICAL,
    # workflows: a step left waiting with every dependency settled (the sweep releases it), and
    # a step that left waiting while a dependency was unsettled (it may have run too early)
    "workflow_step_stranded": WARNING,
    "workflow_step_released_early": CRITICAL,
    # the ledger as a whole
    "dead_letters": WARNING,
    "replication_requirement": CRITICAL,
}
# The integrity finding codes, each counted in the JSON even when zero.
_INTEGRITY_CODES = ("checksum_mismatch", "stuck", "attempts_exceeded", "replication_insufficient")


@dataclass
class Issue:
    severity: str
    check: str
    detail: str
    message_id: str | None = None
    #: ``detail`` in the active language, for the text output (``--json`` keeps ``detail``).
    text: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "check": self.check,
            "message_id": self.message_id,
            "detail": self.detail,
        }


class Verification:
    """One run's checks over ``service``'s database (or ``queue``) and the issues they found.

    Every issue is counted; at most ``max_issues`` are listed with their detail.
    """

    def __init__(self, service: ZeroLossMessageService, queue: str | None, *, max_issues: int) -> None:
        self.service = service
        self.queue = queue
        self.max_issues = max_issues
        self.issues: list[Issue] = []
        self.issue_counts: dict[str, int] = {}
        self.severities: dict[str, str] = {}
        #: The integrity pass's batches (how many, the largest), for the command's log.
        self.fetched = PayloadBatches(service)

    def add(
        self,
        check: str,
        detail: str,
        message_id: str | None = None,
        *,
        severity: str | None = None,
        text: str | None = None,
    ) -> None:
        """Count one issue of code ``check`` (listed while under ``--max-issues``)."""
        severity = SEVERITY.get(check, severity or CRITICAL)
        self.severities[check] = severity
        self.issue_counts[check] = self.issue_counts.get(check, 0) + 1
        if len(self.issues) < self.max_issues:
            self.issues.append(Issue(severity, check, detail, message_id, text or detail))

    def add_found(
        self, check: str, template: str, values: dict[str, Any], message_id: str | None = None
    ) -> None:
        """:meth:`add` with ``template`` (marked with ``gettext_noop``): English for ``--json``,
        the active language for the text output."""
        self.add(check, template % values, message_id, text=_(template) % values)

    def count_only(self, check: str, n: int) -> None:
        """Count ``n`` more issues of ``check`` beyond those already listed (no detail)."""
        if n > 0:
            self.severities[check] = SEVERITY.get(check, CRITICAL)
            self.issue_counts[check] = self.issue_counts.get(check, 0) + n

    # -- integrity ----------------------------------------------------------------------

    def integrity(
        self, sample: int | None, replication: bool, progress: Callable[[int], Progress]
    ) -> tuple[dict[str, Any], list[int]]:
        """Check each message (all, or ``sample`` at random); the summary and the sampled pks.

        ``progress(total)`` opens the progress bar the pass advances batch by batch.
        """
        service, queue = self.service, self.queue
        qs = Message.objects.using(service.using)
        if queue is not None:
            qs = qs.filter(queue_name=queue)
        if sample:
            pks = list(qs.order_by("?").values_list("id", flat=True)[:sample])
            total = len(pks)
            sizes = self.fetched.sizes_of(sorted(pks))
        else:
            pks = []
            total = qs.count()
            sizes = self.fetched.all_sizes(queue)
        now = service.database_now()
        checked = 0
        found = dict.fromkeys(_INTEGRITY_CODES, 0)
        bar = progress(total)
        try:
            for batch in self.fetched.batches(sizes):
                for message in batch:
                    checked += 1
                    for finding in self.findings(service, message, now, replication):
                        found[finding.code] = found.get(finding.code, 0) + 1
                        self.add(finding.code, finding.detail, message.message_id, severity=finding.severity)
                bar.advance(len(batch))
        finally:
            bar.close()
        result = {
            "messages_checked": checked,
            "sampled": bool(sample),
            "replication_checked": replication,
            **found,
        }
        return result, pks

    @staticmethod
    def findings(
        service: ZeroLossMessageService, message: Message, now: Any, replication: bool
    ) -> list[IntegrityFinding]:
        """The service's findings; replication is measured here with ``record=False`` (no write)."""
        return list(service.verify_message(message, now, replication=replication, record=False).findings)

    # -- conservation -------------------------------------------------------------------

    def conservation(self, sample_pks: list[int] | None) -> dict[str, Any]:
        """The set-based counts over the ledger (or the queue); ``sample_pks`` narrows the status check."""
        service, queue = self.service, self.queue
        alias = service.using
        conn = connections[alias]
        name = "CONSERVATION_OF_QUEUE" if queue else "CONSERVATION"
        [(persisted_events, purged, *per_status)], _ = engine_for(conn).run(
            conn, statements_reads, name, {"queue": queue}
        )
        persisted_events, purged = int(persisted_events), int(purged)
        statuses = statements_reads.CONSERVATION_STATUSES
        by_status = {s: int(n) for s, n in zip(statuses, per_status, strict=True)}
        persisted = persisted_events + purged
        accounted = sum(by_status.values()) + purged
        if persisted != accounted:
            self.add_found(
                "unbalanced",
                gettext_noop(
                    "%(persisted)s message(s) persisted (%(events)s persisted events + %(purged)s purged) "
                    "but %(accounted)s accounted for (%(by_status)s, %(purged)s purged)"
                ),
                {
                    "persisted": persisted,
                    "events": persisted_events,
                    "purged": purged,
                    "accounted": accounted,
                    "by_status": ", ".join(f"{n} {s}" for s, n in by_status.items()),
                },
            )

        messages = Message.objects.using(alias)
        events = MessageEvent.objects.using(alias)
        if queue is not None:
            messages = messages.filter(queue_name=queue)

        orphans = events.filter(~Exists(Message.objects.using(alias).filter(pk=OuterRef("message_id"))))
        if queue is not None:
            orphans = orphans.none()  # an orphan has no queue; checked by the ledger-wide run
        orphan_count = orphans.count()
        for ev in orphans.order_by("id")[: self.max_issues]:
            self.add_found(
                "orphan_event",
                gettext_noop(
                    "audit row %(pk)s (%(reason)s, to %(to_status)s) refers to missing message pk %(message_pk)s"
                ),
                {"pk": ev.pk, "reason": ev.reason, "to_status": ev.to_status, "message_pk": ev.message_id},
            )
        self.count_only("orphan_event", orphan_count - min(orphan_count, self.max_issues))

        missing = messages.filter(~Exists(events.filter(message_id=OuterRef("pk"), reason="persisted")))
        missing_count = missing.count()
        for mid in missing.order_by("id").values_list("message_id", flat=True)[: self.max_issues]:
            self.add_found("missing_persisted_event", gettext_noop("no 'persisted' audit row"), {}, mid)
        self.count_only("missing_persisted_event", missing_count - min(missing_count, self.max_issues))

        dups = (
            events.filter(reason="persisted", message_id__in=messages.values("pk"))
            .order_by()
            .values("message_id")
            .annotate(n=Count("id"))
            .filter(n__gt=1)
        )
        dup_rows = list(dups)
        names = dict(
            messages.filter(pk__in=[r["message_id"] for r in dup_rows]).values_list("pk", "message_id")
        )
        for r in dup_rows:
            self.add_found(
                "duplicate_persisted_event",
                gettext_noop("%(n)s 'persisted' audit rows"),
                {"n": r["n"]},
                names.get(r["message_id"]),
            )

        # Edges of the state machine: every audit row must be one (zeroloss.core.states.TRANSITIONS).
        edges = events if queue is None else events.filter(message__queue_name=queue)
        for row in edges.order_by().values("from_status", "to_status", "reason").annotate(n=Count("id")):
            if not is_allowed(row["from_status"], row["to_status"], row["reason"]):
                self.add_found(
                    "disallowed_transition",
                    gettext_noop(
                        "%(n)s audit row(s) record %(from_status)s -> %(to_status)s (%(reason)s), "
                        "an edge the state machine does not have"
                    ),
                    {**row, "from_status": row["from_status"] or "(new)"},
                )

        # Annotations (a deduplicated send) repeat the status: the latest *move* decides.
        latest = (
            events.filter(message_id=OuterRef("pk"))
            .exclude(reason__in=[r.value for r in ANNOTATIONS])
            .order_by("-id")
            .values("to_status")[:1]
        )
        scope = messages if sample_pks is None else messages.filter(pk__in=sample_pks)
        mismatched = scope.annotate(last_to=Subquery(latest)).filter(
            Q(last_to__isnull=True) | ~Q(last_to=F("status"))
        )
        mismatch_count = mismatched.count()
        for mid, status, last in mismatched.order_by("id").values_list("message_id", "status", "last_to")[
            : self.max_issues
        ]:
            self.add_found(
                "status_mismatch",
                gettext_noop("status is %(status)s but the latest audit row moved it to %(last)s"),
                {"status": repr(status), "last": repr(last)},
                mid,
            )
        self.count_only("status_mismatch", mismatch_count - min(mismatch_count, self.max_issues))

        return {
            "persisted": persisted,
            "persisted_events": persisted_events,
            "purged": purged,
            **by_status,
            "accounted": accounted,
            "balanced": persisted == accounted,
            "orphan_events": orphan_count,
            "missing_persisted_event": missing_count,
            "duplicate_persisted_event": len(dup_rows),
            "status_mismatch": mismatch_count,
            "status_checked": len(sample_pks) if sample_pks is not None else sum(by_status.values()),
            "orphans_checked": queue is None,
        }

    # -- the ledger as a whole ----------------------------------------------------------

    def dead_letters(self) -> dict[str, int]:
        """Dead letters (of the queue) against ``HEALTH_MAX_DEAD``."""
        dead = Message.objects.using(self.service.using).dead()
        if self.queue is not None:
            dead = dead.filter(queue_name=self.queue)
        dead_count = dead.count()
        max_dead = self.service.settings.HEALTH_MAX_DEAD
        if dead_count > max_dead:
            self.add_found(
                "dead_letters",
                gettext_noop("%(count)s dead letter(s), above HEALTH_MAX_DEAD=%(max)s"),
                {"count": dead_count, "max": max_dead},
            )
        return {"count": dead_count, "max": max_dead}

    def workflows(self) -> dict[str, int]:
        """The invariants of workflows' steps (of the queue): none stranded, none released early."""
        found = self.service.workflows.invariants(self.queue, limit=self.max_issues)
        for mid in found.stranded_ids:
            self.add_found(
                "workflow_step_stranded",
                gettext_noop(
                    "waiting although every dependency settled: its release was missed (the sweep releases it)"
                ),
                {},
                mid,
            )
        self.count_only("workflow_step_stranded", found.stranded - len(found.stranded_ids))
        for mid, upstream, status in found.released_early_rows:
            self.add_found(
                "workflow_step_released_early",
                gettext_noop("%(status)s while its dependency %(upstream)s is not settled"),
                {"status": status, "upstream": upstream},
                mid,
            )
        self.count_only("workflow_step_released_early", found.released_early - len(found.released_early_rows))
        return {"stranded": found.stranded, "released_early": found.released_early}

    def replication(self) -> dict[str, Any]:
        """The replication requirement: standbys required and streaming."""
        req = replication_requirement(self.service)
        for problem in req.problems:
            self.add("replication_requirement", problem)
        return {
            "required": req.required,
            "available": req.available,
            "ok": req.ok,
            "problems": list(req.problems),
        }

    def verdict(self) -> tuple[str, int]:
        """``(status, exit code)``: the worst severity among the issues found."""
        severities = set(self.severities.values())
        if CRITICAL in severities:
            return CRITICAL, EXIT_CRITICAL
        if WARNING in severities:
            return WARNING, EXIT_WARNING
        return "ok", EXIT_OK
