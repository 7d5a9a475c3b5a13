"""A real OS process for the multi-process tests: ``python -m tests.infra.child ROLE JSON_ARGS``.

It talks to the test database named by ``DATABASE_URL`` (set by the parent) and prints
one JSON line per result on stdout. Roles that wait for a start signal poll for a file so
that many processes start their work at the same moment.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.waiting import NEVER, wait_until


def _emit(**data: Any) -> None:
    print(json.dumps(data, default=str), flush=True)


def _wait_for(path: str | None) -> None:
    if not path:
        return
    from django.db import connection

    connection.ensure_connection()  # connect before the signal, so all start at once
    Path(f"{path}.ready.{os.getpid()}").touch()  # tells the parent this one is waiting
    if not wait_until(Path(path).exists, 120, interval=0.005):
        raise SystemExit("start signal never came")


def main() -> None:
    role, args = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()
    from zeroloss.ledger.service import ZeroLossMessageService

    service = ZeroLossMessageService(instance_id=args.get("instance_id"), **args.get("overrides", {}))

    if role == "persist":
        for i in range(args["count"]):
            service.persist_message(f"{args['prefix']}-{i}", args["queue"], {"n": i, "text": "x" * 50})
        _emit(persisted=args["count"])
        if args.get("hang"):
            NEVER.wait()  # until the test kills it
    elif role == "claim_and_hang":
        lease = service.claim_message(args["message_id"])
        _emit(token=str(lease.token) if lease else None, expires_at=lease.expires_at if lease else None)
        NEVER.wait()  # until the test kills it
    elif role == "hold_and_renew":
        leases = [service.claim_message(m) for m in args["message_ids"]]
        _emit(tokens={lease.message_id: str(lease.token) for lease in leases if lease})
        end = time.monotonic() + args["seconds"]
        while time.monotonic() < end:
            for lease in leases:
                if lease and not service.renew_lease(lease.message_id, lease.token):
                    _emit(lost=lease.message_id)
            time.sleep(args["renew_every"])  # the renewal period: what the test measures
        _emit(done=True)
    elif role == "back_to_back_writer":
        # One write transaction after another, each holding SQLite's write lock for a while (as a
        # worker's outcome-and-claim transaction does under load), until the stop file appears.
        from django.db import transaction

        leases = [service.claim_message(m) for m in args["message_ids"]]
        _emit(tokens=len([x for x in leases if x]))
        transactions = 0
        while not Path(args["stop_file"]).exists():
            with transaction.atomic():
                service.renew_leases([x for x in leases if x])
                time.sleep(args["hold"])
            transactions += 1
        _emit(transactions=transactions)
    elif role == "sweep":
        _wait_for(args.get("start_file"))
        requeued: list[str] = []
        dead: list[str] = []
        # Keep sweeping until a whole pass finds nothing, like the sweep loop does.
        while True:
            report = service.sweep(batch_size=args.get("batch_size", 50))
            requeued += report.requeued
            dead += report.dead_lettered
            if not report.total:
                break
        _emit(requeued=requeued, dead_lettered=dead)
    elif role == "claim":
        _wait_for(args.get("start_file"))
        claims = []
        while True:
            batch = service.claim(args["queue"], limit=args.get("limit", 10))
            if not batch:
                break
            claims += [[lease.message_id, str(lease.token), lease.expires_at.isoformat()] for lease in batch]
        _emit(claims=claims)
    elif role == "send_ordered":
        import zeroloss

        _wait_for(args.get("start_file"))
        sent = []
        for message_id, key, payload in args["messages"]:
            called = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the host
            zeroloss.send(args["queue"], payload, message_id=message_id, ordering_key=key)
            sent.append([message_id, called, time.monotonic()])
        _emit(sent=sent)
    elif role == "send_routed":
        # Sends each queue's messages in a transaction on that queue's own ledger database,
        # then shows that a send inside a transaction on the wrong database is refused.
        from django.db import transaction

        import zeroloss
        from zeroloss.exceptions import InvalidMessage
        from zeroloss.runtime.transports import database_for

        for queue, count in args["sends"].items():
            alias = database_for(queue)
            with transaction.atomic(using=alias):
                for n in range(count):
                    zeroloss.send(queue, {"n": n}, message_id=f"{queue}-{n}")
        refused = ""
        try:
            with transaction.atomic():  # on default, while the queue's ledger is elsewhere
                zeroloss.send(args["elsewhere"], {}, message_id="wrong-transaction")
        except InvalidMessage as exc:
            refused = str(exc)
        _emit(done=True, refused=refused)
    elif role == "dedup_send":
        import zeroloss

        _wait_for(args.get("start_file"))
        message = zeroloss.send(
            args["queue"], {"from": args["me"]}, message_id=args["me"], dedup_key=args["key"]
        )
        _emit(got=message.message_id)
    elif role == "register_node":
        node = service.register_replication_node(
            args["node_id"], args.get("address", ""), role=args.get("role", "node")
        )
        _emit(node_id=node.node_id)
    elif role == "list_nodes":
        _emit(nodes=[n.node_id for n in service.get_replication_targets()])
    elif role == "read":
        stored = service.get_message(args["message_id"])
        lease = service.claim_message(args["message_id"]) if args.get("claim") else None
        _emit(
            found=stored is not None,
            payload=stored.payload if stored else None,
            status=stored.status if stored else None,
            claimed=bool(lease),
            valid=service.verify_message_integrity(args["message_id"]).valid,
        )
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    main()
