"""``manage.py zeroloss_nodes list|register|unregister|discover``: the replication node registry.

The registry says which nodes exist and when each was last seen (a node not seen for
``NODE_TTL`` is shown ``down``, never deleted). Copies are *measured* separately, from the
primary's ``pg_stat_replication``; the summary line and ``--json``'s ``replication`` object
report that measurement.

Exit codes: 0 success; 1 the replication requirement (``REPLICATION_FACTOR - 1`` streaming
standbys) is not met (``list`` and ``discover``), or ``unregister`` found no such node;
2 bad arguments; 4 the ledger could not be reached.

``--verbosity 0`` prints the node table only (no summary line); 2 adds each node's flush
position and metadata.
"""

from __future__ import annotations

import json as json_text
from typing import Any

from django.core.management.base import CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from ...exceptions import InvalidMessage
from ...integrations import replication
from ...ledger.models import NodeRole, ReplicationNode
from ...ledger.service import ZeroLossMessageService
from ...ops.snapshot import format_duration
from ..base import WarningFound, ZeroLossCommand

ACTIONS = ("list", "register", "unregister", "discover")


class Command(ZeroLossCommand):
    help = gettext_noop(
        "List, register, unregister or discover (from pg_stat_replication) replication nodes. "
        "Exit code 1 when the replication requirement is not met."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=ACTIONS, help=_("What to do."))
        parser.add_argument("node_id", nargs="?", help=_("The node (register, unregister)."))
        parser.add_argument("--address", default="", help=_("register: host:port of the node."))
        parser.add_argument(
            "--role", default=NodeRole.NODE, choices=NodeRole.values, help=_("register: %(choices)s.")
        )
        parser.add_argument(
            "--metadata", default=None, help=_('register: a JSON object, e.g. \'{"zone": "a"}\'.')
        )

    def handle(self, *, action: str, node_id: str | None, json: bool, **options: Any) -> None:
        service = self.service(options)
        if action in ("register", "unregister") and not node_id:
            self.usage_error(_("%(action)s needs a NODE_ID") % {"action": action})
        if action in ("list", "discover") and node_id:
            self.usage_error(
                _("%(action)s takes no NODE_ID (got %(node)s)") % {"action": action, "node": repr(node_id)}
            )
        if action == "register":
            assert node_id is not None
            self._register(service, node_id, options, as_json=json)
        elif action == "unregister":
            assert node_id is not None
            try:
                removed = service.unregister_replication_node(node_id)
            except InvalidMessage as exc:
                self.usage_error(str(exc))
            if not removed:
                raise WarningFound(
                    _("no node %(node)s is registered; nothing was removed.") % {"node": repr(node_id)}
                )
            if json:
                self.emit_json({"unregistered": node_id})
            else:
                self.stdout.write(_("unregistered %(node)s") % {"node": node_id})
        else:
            if action == "discover" and replication.in_recovery(service):
                self.usage_error(
                    _("this database is a standby in recovery: run discover against the primary")
                )
            discovered = replication.discover(service) if action == "discover" else None
            self._report(service, discovered, as_json=json)

    def _register(
        self, service: ZeroLossMessageService, node_id: str, options: dict[str, Any], *, as_json: bool
    ) -> None:
        metadata = None
        if options["metadata"] is not None:
            try:
                metadata = json_text.loads(options["metadata"])
            except ValueError as exc:
                self.usage_error(_("--metadata is not JSON: %(error)s") % {"error": exc})
        try:
            node = service.register_replication_node(
                node_id, options["address"], role=options["role"], metadata=metadata
            )
        except InvalidMessage as exc:
            self.usage_error(str(exc))
        if as_json:
            self.emit_json({"registered": self._node_dict(node, live=True, age=0.0)})
        else:
            where = f"{node.role}, {node.address}" if node.address else node.role
            self.stdout.write(_("registered %(node)s (%(where)s)") % {"node": node.node_id, "where": where})

    @staticmethod
    def _node_dict(node: ReplicationNode, *, live: bool, age: float) -> dict[str, Any]:
        return {
            "node_id": node.node_id,
            "role": node.role,
            "address": node.address,
            "status": "live" if live else "down",
            "last_seen_at": node.last_seen_at.isoformat(),
            "last_seen_seconds_ago": round(age, 3),
            "state": node.state,
            "sync_state": node.sync_state,
            "replay_lsn": replication.format_lsn(node.replay_lsn),
            "flush_lsn": replication.format_lsn(node.flush_lsn),
            "metadata": node.metadata,
        }

    def _report(
        self, service: ZeroLossMessageService, discovered: list[ReplicationNode] | None, *, as_json: bool
    ) -> None:
        now = service.database_now()
        cutoff = replication.live_cutoff(service)
        nodes = [
            self._node_dict(
                n, live=replication.is_live(n, cutoff), age=(now - n.last_seen_at).total_seconds()
            )
            for n in ReplicationNode.objects.using(service.using).order_by("node_id")
        ]
        standbys = replication.streaming_standbys(service)
        req = replication.requirement(service, standbys)
        cfg = service.settings
        summary = {
            "vendor": service.connection.vendor,
            "persistence_level": cfg.PERSISTENCE_LEVEL,
            "replication_factor": cfg.REPLICATION_FACTOR,
            "standbys_required": req.required,
            "standbys_streaming": req.available,
            "ok": req.ok,
            "problems": req.problems,
        }
        if as_json:
            data: dict[str, Any] = {"nodes": nodes, "replication": summary}
            if discovered is not None:
                data["discovered"] = [n.node_id for n in discovered]
            self.emit_json(data)
        else:
            if discovered is not None and self.verbosity >= 1:
                line = _("discovered %(count)s standby(s) in pg_stat_replication") % {
                    "count": len(discovered)
                }
                if discovered:
                    line += f": {', '.join(n.node_id for n in discovered)}"
                self.stdout.write(line)
            detail = self.verbosity >= 2
            self.table(
                [_("NODE"), _("ROLE"), _("STATUS"), _("LAST SEEN"), _("ADDRESS"), _("STATE"), _("SYNC")]
                + [_("REPLAY LSN")]
                + ([_("FLUSH LSN"), _("METADATA")] if detail else []),
                [
                    [
                        n["node_id"],
                        n["role"],
                        n["status"],
                        _("%(duration)s ago") % {"duration": format_duration(n["last_seen_seconds_ago"])},
                        n["address"] or "-",
                        n["state"] or "-",
                        n["sync_state"] or "-",
                        n["replay_lsn"] or "-",
                    ]
                    + (
                        [n["flush_lsn"] or "-", json_text.dumps(n["metadata"], sort_keys=True)]
                        if detail
                        else []
                    )
                    for n in nodes
                ],
            )
            if self.verbosity >= 1:
                self.stdout.write(
                    _(
                        "replication: %(available)s streaming standby(s), %(required)s required "
                        "(REPLICATION_FACTOR=%(factor)s, PERSISTENCE_LEVEL=%(level)s): %(verdict)s"
                    )
                    % {
                        "available": req.available,
                        "required": req.required,
                        "factor": cfg.REPLICATION_FACTOR,
                        "level": cfg.PERSISTENCE_LEVEL,
                        "verdict": _("ok") if req.ok else _("NOT MET"),
                    }
                )
        if not req.ok:
            raise WarningFound(" ".join(req.problems))
