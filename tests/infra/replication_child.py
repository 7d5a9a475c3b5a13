"""A real OS process for the replication tests: ``python -m tests.infra.replication_child ROLE JSON_ARGS``.

``DATABASE_URL`` names the database (the test cluster's primary); ``args["zeroloss"]`` is
laid over the project's ``ZEROLOSS`` setting for the whole process, so the service, the
system checks and the management commands all see the same configuration. Prints one JSON
line per result; the ``manage`` role *is* the command (its stdout, stderr and exit code).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


def _emit(**data: Any) -> None:
    print(json.dumps(data, default=str), flush=True)


def _report(report: Any) -> dict[str, Any]:
    rep = report.replication
    return {
        "valid": report.valid,
        "issues": report.issues,
        "confirmed": rep.confirmed if rep else None,
        "required": rep.required if rep else None,
        "measured": rep.measured if rep else None,
        "confirmed_by": rep.confirmed_by if rep else None,
        "detail": rep.detail if rep else None,
    }


def main() -> int:
    role, args = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.test.utils import override_settings

    with override_settings(ZEROLOSS={**settings.ZEROLOSS, **args.get("zeroloss", {})}):
        return run(role, args)


def run(role: str, args: dict[str, Any]) -> int:
    from django.db import transaction

    from zeroloss.exceptions import ReplicationTimeout
    from zeroloss.integrations import replication
    from zeroloss.ledger.service import ZeroLossMessageService

    service = ZeroLossMessageService(instance_id=args.get("instance_id", f"repl-child-{os.getpid()}"))

    if role == "manage":
        from django.core.management import execute_from_command_line

        try:
            execute_from_command_line(["manage.py", *args["argv"]])
        except SystemExit as exc:
            return int(exc.code or 0)
        return 0
    if role == "persist":
        started = time.monotonic()
        try:
            if args.get("batch"):
                stored = service.persist_messages(
                    [(m, args.get("queue", "repl"), args["data"]) for m in args["batch"]]
                )
                _emit(ok=True, commit_lsns=[m.commit_lsn for m in stored], elapsed=time.monotonic() - started)
            elif args.get("atomic"):
                with transaction.atomic():
                    service.persist_message(args["message_id"], args.get("queue", "repl"), args["data"])
                    _emit(inside_atomic="returned")
            else:
                message = service.persist_message(args["message_id"], args.get("queue", "repl"), args["data"])
                _emit(ok=True, commit_lsn=message.commit_lsn, elapsed=time.monotonic() - started)
        except ReplicationTimeout as exc:
            _emit(
                ok=False,
                error=type(exc).__name__,
                text=str(exc),
                confirmed=exc.confirmed,
                required=exc.required,
                elapsed=time.monotonic() - started,
            )
        return 0
    if role == "verify":
        _emit(**_report(service.verify_message_integrity(args["message_id"])))
        return 0
    if role == "checks":
        from django.core.checks import run_checks

        found = run_checks(databases=args.get("databases"))
        _emit(checks=[[m.id, m.msg] for m in found if (m.id or "").startswith("zeroloss.")])
        return 0
    if role == "stats":
        from zeroloss.ops.snapshot import compute_snapshot

        health = compute_snapshot(service).replication
        _emit(required=health.required, available=health.available, ok=health.ok, problems=health.problems)
        return 0
    if role == "register":
        for node_id in args["node_ids"]:
            service.register_replication_node(node_id, f"10.0.0.{len(node_id)}:5432", role="node")
        _emit(registered=args["node_ids"])
        return 0
    if role == "targets":
        _emit(targets=[n.node_id for n in service.get_replication_targets()])
        return 0
    if role == "sweep":
        from zeroloss.runtime.sweep_loop import SweepLoop
        from zeroloss.runtime.transports import after_sweep_hooks

        SweepLoop(service, after_sweep=after_sweep_hooks(service)).run_once()
        _emit(nodes={n.node_id: [n.role, n.state] for n in replication.live_nodes(service)})
        return 0
    if role == "ttl":
        # Register two nodes, keep one heartbeating; time when the silent one turns down.
        ttl = service.settings.NODE_TTL
        service.register_replication_node("beating")
        # Before the insert: its last_seen_at is the server's statement time, after this.
        registered = time.monotonic()
        service.register_replication_node("silent")
        down_after = None
        beating_always_live = True
        while time.monotonic() - registered < ttl + 2:
            service.heartbeat_node("beating")
            live = {n.node_id for n in replication.live_nodes(service)}
            beating_always_live &= "beating" in live
            if down_after is None and "silent" not in live:
                down_after = time.monotonic() - registered
            time.sleep(0.05)  # the heartbeat period: the TTL in real time is what is measured
        _emit(down_after=down_after, beating_always_live=beating_always_live, ttl=ttl)
        return 0
    raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    sys.exit(main())
