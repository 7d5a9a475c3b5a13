"""``manage.py zeroloss_requeue``: put stuck or dead messages back in the queue, exactly once.

Two ways to select messages (not both):

- ``ID ...``: processing messages whose lease expired are requeued, dead letters are
  redriven; a *live* lease is only revoked with ``--force`` (the running worker's
  acknowledgement will then be refused by fencing). More than 100 IDs ask for confirmation.
- ``--queue Q --state stuck|dead [--older-than DURATION] [--limit N]``: a set-based
  selection, always confirmed (``--yes`` for scripts). ``--older-than`` counts from the lease
  expiry (stuck) or the dead-lettering (dead), on the database clock.

Every move goes through :class:`~zeroloss.service.ZeroLossMessageService`, whose conditional
UPDATE moves a message only from the state it was selected in, so a message requeued by
the sweep or another operator meanwhile is reported as skipped, never moved twice.

Exit codes: 0 every selected message was requeued (or would be, with ``--dry-run``);
1 some were skipped (wrong state, live lease without ``--force``, changed meanwhile);
2 bad arguments; 3 not confirmed; 4 the ledger could not be reached (batches moved before
the failure stay moved: run the command again). JSON schema: docs/operations.md.

``--verbosity 0`` prints the summary line and the skipped messages only; 2 lists every
requeued ID (the default lists the first 50).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.core.management.base import CommandParser
from django.db.models import QuerySet
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop, pgettext

from ...ledger.models import Message, Status
from ...ledger.service import ZeroLossMessageService, validate_message_id
from ...ops.snapshot import invalidate
from ..base import CONFIRM_THRESHOLD, Incomplete, ZeroLossCommand, parse_duration, positive_int

BATCH = 500


class Command(ZeroLossCommand):
    help = gettext_noop(
        "Requeue stuck (expired-lease) messages and redrive dead letters, by ID or by "
        "--queue/--state selection, through the service (exactly once per message)."
    )
    changes_data = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="*", metavar="ID", help=_("Message IDs to requeue or redrive."))
        parser.add_argument("--queue", help=_("Select messages of this queue (with --state)."))
        parser.add_argument(
            "--state",
            choices=["stuck", Status.DEAD.value],
            help=_("stuck: expired leases; dead: dead letters."),
        )
        parser.add_argument(
            "--older-than",
            type=parse_duration,
            metavar="DURATION",
            help=_("Only messages stuck/dead for longer than this (90s, 15m, 2h, 7d; default: any age)."),
        )
        parser.add_argument(
            "--limit",
            type=positive_int,
            help=_("Requeue at most N messages, oldest first (default: no limit)."),
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help=_("With IDs: also revoke live leases (the running worker's ack will be refused)."),
        )

    def handle(
        self,
        *,
        ids: list[str],
        queue: str | None,
        state: str | None,
        older_than: float | None,
        limit: int | None,
        force: bool,
        dry_run: bool,
        json: bool,
        **options: Any,
    ) -> None:
        ids = list(dict.fromkeys(ids))  # de-duplicated, order kept
        selecting = queue is not None or state is not None
        if ids and selecting:
            self.usage_error(_("give message IDs or --queue/--state, not both"))
        if not ids and not selecting:
            self.usage_error(_("give message IDs, or --queue Q --state stuck|dead"))
        if selecting and (queue is None or state is None):
            self.usage_error(_("--queue and --state go together"))
        if ids and (older_than is not None or limit is not None):
            self.usage_error(_("--older-than and --limit apply to a --queue/--state selection, not to IDs"))
        if selecting and force:
            self.usage_error(
                _("--force applies to message IDs; a --state stuck selection only takes expired leases")
            )
        service = self.service(options)
        # The helpers read these back (confirm() and progress() read "yes" and "json").
        options.update(force=force, dry_run=dry_run, json=json, older_than=older_than, limit=limit)
        if ids:
            result = self.by_ids(service, ids, options)
        else:
            assert queue is not None and state is not None
            self.check_queue(service, queue)
            result = self.by_selection(service, queue, state, options)
        if not dry_run and result["requeued"]:
            invalidate(service)
        self.report(result, as_json=json)
        if result["skipped"]:
            counts = {"skipped": len(result["skipped"]), "matched": result["matched"]}
            raise Incomplete(
                (
                    _("%(skipped)s of %(matched)s selected message(s) would not be requeued")
                    if dry_run
                    else _("%(skipped)s of %(matched)s selected message(s) were not requeued")
                )
                % counts
            )

    # -- by ID --------------------------------------------------------------------------

    def by_ids(
        self, service: ZeroLossMessageService, ids: list[str], options: dict[str, Any]
    ) -> dict[str, Any]:
        for mid in ids:
            try:
                validate_message_id(mid)
            except Exception as exc:
                self.usage_error(str(exc))
        rows: dict[str, tuple[str, dt.datetime | None]] = {}
        messages = Message.objects.using(service.using)
        for start in range(0, len(ids), BATCH):
            for mid, status, expires in messages.filter(
                message_id__in=ids[start : start + BATCH]
            ).values_list("message_id", "status", "lease_expires_at"):
                rows[mid] = (status, expires)
        missing = [m for m in ids if m not in rows]
        if missing:
            shown = ", ".join(repr(m) for m in missing[:10]) + (", ..." if len(missing) > 10 else "")
            self.usage_error(_("unknown message id(s): %(ids)s") % {"ids": shown})
        now = service.database_now()
        force = options["force"]
        plan: dict[str, str] = {}  # id -> "requeue" | "redrive"
        skipped: list[dict[str, Any]] = []
        for mid in ids:
            status, expires = rows[mid]
            if status == Status.DEAD:
                plan[mid] = "redrive"
            elif status == Status.PROCESSING and (force or (expires is not None and expires < now)):
                plan[mid] = "requeue"
            elif status == Status.PROCESSING:
                reason = gettext_noop("lease is live (use --force)")
                skipped.append({"message_id": mid, "status": status, "reason": reason})
            else:
                skipped.append({"message_id": mid, "status": status, "reason": f"message is {status}"})
        result: dict[str, Any] = {
            "dry_run": options["dry_run"],
            "selection": {
                "ids": ids,
                "queue": None,
                "state": None,
                "older_than_seconds": None,
                "limit": None,
            },
            "force": force,
            "matched": len(ids),
            "requeued": [],
            "skipped": skipped,
        }
        if options["dry_run"]:
            result["requeued"] = list(plan)
            return result
        if len(plan) > CONFIRM_THRESHOLD:
            self.confirm(_("Requeue %(count)s messages?") % {"count": len(plan)}, options)
        actor = self.actor()
        bar = self.progress(len(plan), pgettext("a progress bar's label", "requeue"), options)
        moved: list[str] = []
        try:
            for action in ("redrive", "requeue"):
                chosen = [m for m in plan if plan[m] == action]
                for start in range(0, len(chosen), BATCH):
                    chunk = chosen[start : start + BATCH]
                    if action == "redrive":
                        moved += service.redrive_messages(chunk, actor=actor)
                    else:
                        moved += service.requeue_messages(chunk, actor=actor, force=force)
                    bar.advance(len(chunk))
        finally:
            bar.close()
        done = set(moved)
        result["requeued"] = [m for m in plan if m in done]
        result["skipped"] += self.changed_meanwhile(service, [m for m in plan if m not in done])
        return result

    # -- by selection -------------------------------------------------------------------

    def selection(
        self, service: ZeroLossMessageService, queue: str, state: str, cutoff: dt.datetime
    ) -> QuerySet[Message]:
        messages = Message.objects.using(service.using).filter(queue_name=queue)
        if state == "stuck":
            return messages.filter(status=Status.PROCESSING, lease_expires_at__lt=cutoff).order_by(
                "lease_expires_at", "id"
            )
        return messages.filter(status=Status.DEAD, dead_at__lt=cutoff).order_by("dead_at", "id")

    def by_selection(
        self, service: ZeroLossMessageService, queue: str, state: str, options: dict[str, Any]
    ) -> dict[str, Any]:
        limit = options["limit"]
        older = options["older_than"] or 0.0
        # One cutoff on the database clock for the whole run: messages that become stuck or
        # dead while it runs are not taken, so the run is bounded by what was confirmed.
        now = service.database_now()
        cutoff = now - dt.timedelta(seconds=older)
        qs = self.selection(service, queue, state, cutoff)
        matched = qs.count() if limit is None else min(qs.count(), limit)
        result: dict[str, Any] = {
            "dry_run": options["dry_run"],
            "selection": {
                "ids": None,
                "queue": queue,
                "state": state,
                "older_than_seconds": options["older_than"],
                "limit": limit,
            },
            "force": False,
            "matched": matched,
            "requeued": [],
            "skipped": [],
        }
        if options["dry_run"]:
            result["requeued"] = list(qs.values_list("message_id", flat=True)[:matched])
            return result
        if matched == 0:
            return result
        question = (
            _("Redrive %(count)s %(state)s message(s) of queue %(queue)s?")
            if state == Status.DEAD
            else _("Requeue %(count)s %(state)s message(s) of queue %(queue)s?")
        )
        self.confirm(question % {"count": matched, "state": state, "queue": repr(queue)}, options)
        actor = self.actor()
        moved: list[str] = []
        missed: list[str] = []
        bar = self.progress(matched, pgettext("a progress bar's label", "requeue"), options)
        try:
            # Moved rows leave the selection, so each pass takes the next oldest ones.
            while len(moved) + len(missed) < matched:
                room = min(BATCH, matched - len(moved) - len(missed))
                chunk = list(qs.exclude(message_id__in=missed).values_list("message_id", flat=True)[:room])
                if not chunk:
                    break
                if state == Status.DEAD:
                    done = service.redrive_messages(chunk, actor=actor)
                else:
                    done = service.requeue_messages(chunk, actor=actor, force=False)
                moved += done
                moved_now = set(done)
                missed += [m for m in chunk if m not in moved_now]
                bar.advance(len(chunk))
        finally:
            bar.close()
        result["requeued"] = moved
        result["skipped"] = self.changed_meanwhile(service, missed)
        return result

    # -- output -------------------------------------------------------------------------

    def changed_meanwhile(self, service: ZeroLossMessageService, ids: Sequence[str]) -> list[dict[str, Any]]:
        if not ids:
            return []
        now_status = dict(
            Message.objects.using(service.using)
            .filter(message_id__in=ids)
            .values_list("message_id", "status")
        )
        return [
            {
                "message_id": m,
                "status": now_status.get(m, "missing"),
                "reason": gettext_noop("changed meanwhile"),
            }
            for m in ids
        ]

    def report(self, result: dict[str, Any], *, as_json: bool) -> None:
        if as_json:
            self.emit_json(result)
            return
        counts = {"requeued": len(result["requeued"]), "matched": result["matched"]}
        if result["dry_run"]:
            verb = _("would requeue")
            head = _("would requeue %(requeued)s of %(matched)s selected message(s)") % counts
        else:
            verb = _("requeued")
            head = _("requeued %(requeued)s of %(matched)s selected message(s)") % counts
        self.stdout.write(head)
        if result["requeued"] and self.verbosity >= 1:
            shown = result["requeued"] if self.verbosity >= 2 else result["requeued"][:50]
            self.table(["message_id", _("result")], [[m, verb] for m in shown])
            if len(result["requeued"]) > len(shown):
                self.stdout.write(
                    _("... and %(count)s more (--json lists all)")
                    % {"count": len(result["requeued"]) - len(shown)}
                )
        if result["skipped"]:
            self.stdout.write("")
            # The reasons stay English in --json (machine-readable); the table translates them.
            self.table(
                ["message_id", "status", _("skipped because")],
                [[s["message_id"], s["status"], self.reason_text(s["reason"])] for s in result["skipped"]],
            )

    @staticmethod
    def reason_text(reason: str) -> str:
        """A skip reason of ``--json`` (English) in the active language."""
        if reason.startswith("message is "):
            return _("message is %(status)s") % {"status": reason.removeprefix("message is ")}
        return _(reason)  # "lease is live (use --force)", "changed meanwhile": marked where made
