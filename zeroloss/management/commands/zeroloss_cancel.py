"""``manage.py zeroloss_cancel ID... [--abort]``: stop messages before they run, or while they run.
``zeroloss_cancel --workflow ID``: every step of a workflow not yet finished (``zeroloss.cancel_workflow``:
waiting and pending steps cancelled, running ones aborted).

Every id is checked first: a malformed or unknown one is exit code 2 and nothing is changed.
Then each message on its own (one transaction for all of them): a pending one (claimable,
delayed, or waiting behind its ordering key's head) is cancelled; a processing one is left
alone and reported as running, unless ``--abort``: then its handler sees
``delivery.abort_requested`` within a second and its outcome is ``cancelled`` when it ends.
Completed, dead and already cancelled messages are reported, unchanged.

Exit codes: 0 every message is now cancelled (by this call or before it) or, with ``--abort``,
asked to abort (by this call or before it); 1 some are not (running without ``--abort``, or
finished); 2 bad arguments (a malformed or unknown message or workflow id); 4 the ledger could not be reached
(nothing changed). JSON schema: docs/control.md.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from ...exceptions import InvalidMessage, MessageNotFound
from ...ledger.models import Message, Workflow
from ...ledger.service import validate_message_id
from ...ledger.types import CancelOutcome, CancelResult
from ...ops.snapshot import invalidate
from ...runtime.workflows import cancel_workflow
from ..base import Incomplete, ZeroLossCommand

BATCH = 500

#: How each outcome reads on a terminal (the JSON says ``outcome``).
SAYS = {
    CancelOutcome.CANCELLED: gettext_noop("cancelled"),
    CancelOutcome.ABORT_REQUESTED: gettext_noop("abort requested: cancelled when its handler ends"),
    CancelOutcome.RUNNING: gettext_noop("running: left alone (use --abort to stop it)"),
    CancelOutcome.ABORT_ALREADY_REQUESTED: gettext_noop("running: its abort was already requested"),
    CancelOutcome.FINISHED: gettext_noop("already finished"),
    CancelOutcome.ALREADY_CANCELLED: gettext_noop("already cancelled"),
}


def settled(result: CancelResult, abort: bool) -> bool:
    """The message is where the call asked it to be, whether this call or an earlier one put it there:
    asking again is not a failure."""
    return (
        result.ok
        or result.outcome == CancelOutcome.ALREADY_CANCELLED
        or (abort and result.outcome == CancelOutcome.ABORT_ALREADY_REQUESTED)
    )


class Command(ZeroLossCommand):
    help = gettext_noop(
        "Cancel pending messages by ID; with --abort also stop running ones (their outcome is cancelled). "
        "--workflow ID cancels every unfinished step of a workflow, aborting running ones."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("ids", nargs="*", metavar="ID", help=_("Message IDs to cancel."))
        parser.add_argument(
            "--workflow",
            metavar="ID",
            help=_(
                "Cancel every step of this workflow not yet finished: waiting and pending ones at once, "
                "running ones aborted (implies --abort)."
            ),
        )
        parser.add_argument(
            "--abort",
            action="store_true",
            help=_(
                "Also abort processing messages: their handler is asked to stop, the outcome is cancelled."
            ),
        )

    def handle(
        self, *, ids: list[str], workflow: str | None, abort: bool, json: bool, **options: Any
    ) -> None:
        if workflow is not None:
            if ids:
                self.usage_error(_("give message IDs or --workflow ID, not both"))
            self.cancel_workflow(workflow, json, options)
            return
        if not ids:
            self.usage_error(_("give the IDs of the messages to cancel, or --workflow ID"))
        ids = list(dict.fromkeys(ids))  # de-duplicated, order kept
        for mid in ids:
            try:
                validate_message_id(mid)
            except InvalidMessage as exc:
                self.usage_error(str(exc))
        service = self.service(options)
        known: set[str] = set()
        messages = Message.objects.using(service.using)
        for start in range(0, len(ids), BATCH):
            chunk = ids[start : start + BATCH]
            known.update(messages.filter(message_id__in=chunk).values_list("message_id", flat=True))
        missing = [m for m in ids if m not in known]
        if missing:
            shown = ", ".join(repr(m) for m in missing[:10]) + (", ..." if len(missing) > 10 else "")
            self.usage_error(_("unknown message id(s): %(ids)s; nothing was changed") % {"ids": shown})
        try:
            results = service.cancel_messages(ids, abort=abort, actor=self.actor())
        except MessageNotFound as exc:  # purged between the check and the cancel
            self.usage_error(_("unknown message id: %(id)s; nothing was changed") % {"id": str(exc)})
        if any(r.ok for r in results):
            invalidate(service)
        self.report(results, abort=abort, as_json=json)
        failed = [r for r in results if not settled(r, abort)]
        if failed:
            raise Incomplete(
                _("%(failed)s of %(total)s message(s) were not cancelled")
                % {"failed": len(failed), "total": len(results)}
            )

    def cancel_workflow(self, workflow_id: str, as_json: bool, options: dict[str, Any]) -> None:
        """Exit codes as for IDs with ``--abort``: 0 every step is finished, cancelled or asked to
        abort; 1 some step finished otherwise meanwhile; 2 a malformed or unknown workflow id."""
        try:
            validate_message_id(workflow_id, "workflow id")
        except InvalidMessage as exc:
            self.usage_error(str(exc))
        service = self.service(options)
        if not Workflow.objects.using(service.using).filter(workflow_id=workflow_id).exists():
            self.usage_error(
                _("unknown workflow id: %(id)s; nothing was changed") % {"id": repr(workflow_id)}
            )
        results = cancel_workflow(workflow_id, using=service.using, actor=self.actor())
        if any(r.ok for r in results):
            invalidate(service)
        self.report(results, abort=True, as_json=as_json, workflow=workflow_id)
        failed = [r for r in results if not settled(r, True)]
        if failed:
            raise Incomplete(
                _("%(failed)s of %(total)s step(s) of workflow %(id)s were not cancelled")
                % {"failed": len(failed), "total": len(results), "id": workflow_id}
            )

    def report(
        self, results: list[CancelResult], *, abort: bool, as_json: bool, workflow: str | None = None
    ) -> None:
        counts = {o.value: sum(r.outcome == o for r in results) for o in CancelOutcome}
        if as_json:
            self.emit_json(
                {
                    **({"workflow": workflow} if workflow is not None else {}),
                    "abort": abort,
                    "results": [r.as_dict() for r in results],
                    "counts": counts,
                    "ok": all(settled(r, abort) for r in results),
                }
            )
            return
        if workflow is not None and not results:
            self.stdout.write(
                _("workflow %(id)s: every step had finished already; nothing to cancel") % {"id": workflow}
            )
        for r in results:
            self.stdout.write(f"{r.message_id}: {_(SAYS[r.outcome])} ({r.status})")
        self.stdout.write(
            _("%(cancelled)s cancelled, %(aborted)s abort(s) requested, %(left)s not changed")
            % {
                "cancelled": counts[CancelOutcome.CANCELLED],
                "aborted": counts[CancelOutcome.ABORT_REQUESTED],
                "left": len(results)
                - counts[CancelOutcome.CANCELLED]
                - counts[CancelOutcome.ABORT_REQUESTED],
            }
        )
