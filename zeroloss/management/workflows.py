"""``zeroloss_status --workflow ID``: one workflow's steps as a table, by level (the report of
:mod:`zeroloss.ops.workflows`, which the admin's workflow page shows too)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.utils.translation import gettext as _

from ..exceptions import InvalidMessage, WorkflowNotFound
from ..ledger.validation import validate_message_id
from ..ops.workflows import BLOCKED, WorkflowReport, workflow_report

if TYPE_CHECKING:
    from ..ledger.service import ZeroLossMessageService
    from .base import ZeroLossCommand

#: A result or last error in the text table is cut to this many characters (--json has it all).
CELL = 60


def _cell(value: Any) -> str:
    """One line: a result as JSON, an error's first line (a traceback follows it)."""
    if isinstance(value, str):
        text = value.strip().split("\n", 1)[0] if value.strip() else ""
    else:
        text = json.dumps(value, sort_keys=True, default=str)
    text = " ".join(text.split())
    return text if len(text) <= CELL else text[: CELL - 1] + "…"


def read_report(
    command: ZeroLossCommand, service: ZeroLossMessageService, workflow_id: str
) -> WorkflowReport:
    """The report, or a usage error (exit code 2) for a malformed or unknown id, as for a message."""
    try:
        validate_message_id(workflow_id, "workflow id")
        return workflow_report(service, workflow_id)
    except (InvalidMessage, WorkflowNotFound) as exc:
        command.usage_error(str(exc))


def show_workflow(command: ZeroLossCommand, report: WorkflowReport, *, as_json: bool, compact: bool) -> None:
    out = command.stdout
    if as_json:
        data = report.as_dict()
        if compact:
            out.write(json.dumps(data, sort_keys=True, default=str))
        else:
            command.emit_json(data)
        out.flush()
        return
    if compact:
        out.write("")
    out.write(
        _("workflow %(id)s: %(state)s, %(done)s of %(total)s steps finished")
        % {
            "id": report.workflow_id,
            "state": report.state.upper() if report.state == BLOCKED else report.state,
            "done": report.finished_steps,
            "total": len(report.steps),
        }
    )
    rows = []
    for line in report.steps:
        s = line.step
        outcome = _cell(s.result) if s.result is not None else _cell(s.last_error) if s.last_error else ""
        rows.append(
            [
                line.level,
                line.name,
                s.queue_name,
                s.status,
                f"{s.attempts}/{s.max_attempts}",
                ", ".join(line.waits_for) or "-",
                outcome or "-",
            ]
        )
    command.table(
        [_("level"), _("step"), _("queue"), _("status"), _("attempts"), _("waits for"), _("result / error")],
        rows,
    )
    for b in report.blockers:
        out.write(
            _("BLOCKED by dead step %(name)s (%(id)s): %(error)s; it holds %(holds)s")
            % {
                "name": b.name,
                "id": b.message_id,
                "error": _cell(b.last_error) or "-",
                "holds": ", ".join(b.holds),
            }
        )
    if report.blockers:
        out.write(_("  a redrive that completes it releases them (zeroloss_requeue ID)"))
    out.flush()
