"""Replication on a database that cannot replicate (SQLite, or a lone PostgreSQL): both passes.

Nothing here may claim a copy that does not exist.
"""

from __future__ import annotations

import json
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from zeroloss.conf import ZeroLossSettings
from zeroloss.exceptions import ReplicationTimeout
from zeroloss.integrations import replication
from zeroloss.ledger.models import Message
from zeroloss.ledger.service import ZeroLossMessageService
from zeroloss.ops import checks


def test_lsn_helpers():
    assert replication.format_lsn(None) == ""
    assert replication.format_lsn((0x16 << 32) | 0xB374D848) == "16/B374D848"
    block, segment = 8192, 16 * 1024 * 1024
    # Just after a page header: the previous record ended on the boundary.
    assert replication._normalise(3 * block + 24, block, segment) == 3 * block
    assert replication._normalise(5 * segment + 40, block, segment) == 5 * segment
    assert replication._normalise(3 * block + 64, block, segment) == 3 * block + 64


def test_a_lone_database_reports_one_copy_plainly(live_service):
    service = ZeroLossMessageService(replication_factor=2, replication_timeout=0.2)
    service.persist_message("lone-1", "q", {"n": 1})
    report = service.verify_message_integrity("lone-1")
    assert not report.valid and report.replication is not None
    assert (report.replication.confirmed, report.replication.required) == (1, 2)
    assert report.replication.confirmed_by == []
    if connection.vendor == "sqlite":
        assert report.issues == [
            "Insufficient replication: 1/2 (sqlite keeps a single copy: it cannot replicate)"
        ]
    else:
        assert report.issues == [
            "Insufficient replication: 1/2 (no streaming standby is attached to the primary: "
            "PostgreSQL holds a single copy)"
        ]
        assert Message.objects.get(message_id="lone-1").commit_lsn is not None
    from zeroloss.ops.snapshot import compute_snapshot

    health = compute_snapshot(service).replication
    assert (health.required, health.available, health.ok) == (1, 0, False)
    assert ZeroLossMessageService().verify_message_integrity("lone-1").valid  # factor 1: one copy is enough


def test_replicated_persist_without_standbys_raises_and_keeps_the_message(live_service):
    service = ZeroLossMessageService(
        persistence_level="replicated", replication_factor=2, replication_timeout=0.3
    )
    started = time.monotonic()
    with pytest.raises(ReplicationTimeout, match=r"committed on the primary but only 1/2 copies") as err:
        service.persist_message("lone-r", "q", {"n": 1})
    assert time.monotonic() - started < 2.0
    assert (err.value.confirmed, err.value.required) == (1, 2)
    with pytest.raises(ReplicationTimeout):
        service.persist_message("lone-r", "q", {"n": 1})  # a retry is safe: same row
    assert Message.objects.filter(message_id="lone-r").count() == 1
    # REPLICATION_FACTOR=1 asks for the one copy the primary holds.
    one = ZeroLossMessageService(persistence_level="replicated", replication_factor=1)
    assert one.persist_message("lone-1copy", "q", {}).message_id == "lone-1copy"


def test_nodes_command_on_a_lone_database(live_service, capsys, settings):
    call_command(
        "zeroloss_nodes", "register", "n1", "--address", "10.0.0.1:5432", "--metadata", '{"zone": "a"}'
    )
    assert capsys.readouterr().out.strip() == "registered n1 (node, 10.0.0.1:5432)"
    call_command("zeroloss_nodes", "list", "--json")
    data = json.loads(capsys.readouterr().out)
    [node] = data["nodes"]
    assert (node["node_id"], node["status"], node["metadata"]) == ("n1", "live", {"zone": "a"})
    assert data["replication"]["ok"] is True  # REPLICATION_FACTOR=1
    settings.ZEROLOSS = {"REPLICATION_FACTOR": 2}
    with pytest.raises(CommandError) as err:
        call_command("zeroloss_nodes", "list")
    assert err.value.returncode == 1
    out = capsys.readouterr().out
    assert "n1" in out and "NOT MET" in out  # registered nodes are never counted as copies
    with pytest.raises(CommandError) as err:
        call_command("zeroloss_nodes", "register", "n2", "--metadata", "[1")
    assert err.value.returncode == 2
    with pytest.raises(CommandError) as err:
        call_command("zeroloss_nodes", "unregister", "nope")
    assert err.value.returncode == 1


def test_sqlite_replication_checks_say_what_happens():
    cfg = ZeroLossSettings(PERSISTENCE_LEVEL="replicated", REPLICATION_FACTOR=1)
    [_, error] = checks.backend_messages("default", "sqlite", {}, cfg)
    assert error.id == "zeroloss.E010" and "promises nothing beyond 'durable'" in error.msg
    cfg = ZeroLossSettings(PERSISTENCE_LEVEL="replicated", REPLICATION_FACTOR=3)
    [error] = checks.backend_messages("default", "sqlite", {"transaction_mode": "IMMEDIATE"}, cfg)
    assert error.id == "zeroloss.E010" and "every persist would fail with ReplicationTimeout" in error.msg
    [warning] = checks.backend_messages(
        "default", "sqlite", {"transaction_mode": "IMMEDIATE"}, ZeroLossSettings(REPLICATION_FACTOR=2)
    )
    assert warning.id == "zeroloss.W011"
    assert checks.backend_messages("default", "postgresql", {}, cfg) == []


def test_a_replicated_workflow_without_standbys_raises_after_commit_and_keeps_its_steps(live_service):
    """A workflow's steps are confirmed as a send's are: committed, then ReplicationTimeout."""
    from zeroloss.ledger.workflow_graph import StepSpec

    service = ZeroLossMessageService(
        persistence_level="replicated", replication_factor=2, replication_timeout=0.3
    )
    steps = [StepSpec("a", "q", {}), StepSpec("b", "q", {}, after=("a",))]
    with pytest.raises(ReplicationTimeout, match=r"only 1/2 copies"):
        service.workflows.store("rep", steps)
    assert sorted(Message.objects.filter(workflow_id="rep").values_list("message_id", flat=True)) == [
        "rep/a",
        "rep/b",
    ]
