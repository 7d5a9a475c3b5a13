"""Every ops command with every option, against the database of this pass.

In-process runs (``call_command``) check output, JSON schemas and what changed; the command
line run in-process (``command_line``) checks exit codes, argparse errors, the non-TTY refusal,
the prompt and the progress bar. Still a separate process: the prompt and bar on a real
pseudo-terminal of the OS (one test).
"""

from __future__ import annotations

import json

import pytest
from django.db import connection

from tests.support import backdate
from tests.support.cli import FakeTerminal, cli_tty, command_line, run
from tests.support.factories import (
    clear_cache,
    ledger_state,
    make_completed,
    make_dead,
    make_leased,
    make_stuck,
    statuses,
)
from zeroloss.ledger.models import Message, MessageEvent, PurgeRecord, Status
from zeroloss.ledger.service import ZeroLossMessageService

#: A count per status, all zero (a status added later counts zero here too).
NONE = dict.fromkeys(Status.values, 0)

STATUS_KEYS = {
    "database",
    "taken_at",
    "cached",
    "completed_estimated",
    "totals",
    "total",
    "oldest_pending_age",
    "stuck",
    "dead",
    "queues",
    "nodes",
    "replication",
    "sweep",
    "blocked_keys",
    "blocked_keys_truncated",
    "partitions",
    "overdue_schedules",
    "storage",
}
QUEUE_KEYS = {
    "name",
    "counts",
    "total",
    "oldest_pending_age",
    "stuck",
    "dead",
    "paused",
    "concurrency",
    "rate",
}
REQUEUE_KEYS = {"dry_run", "selection", "force", "matched", "requeued", "skipped"}
PURGE_KEYS = {
    "dry_run",
    "status",
    "queue",
    "older_than_seconds",
    "cutoff",
    "limit",
    "batch_size",
    "matched",
    "purged",
    "by_queue",
}
VERIFY_KEYS = {
    "status",
    "exit_code",
    "database",
    "queue",
    "checked_at",
    "integrity",
    "conservation",
    "dead_letters",
    "workflows",
    "replication",
    "issue_counts",
    "issues",
    "issues_total",
    "issues_truncated",
}


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


def assert_usage_error(name: str, *args: str, match: str) -> None:
    before = ledger_state()
    result = run(name, *args)
    assert result.code == 2, result
    assert match in result.err, result.err
    assert ledger_state() == before


# -- zeroloss_status ----------------------------------------------------------------------


@pytest.mark.django_db
class TestStatus:
    def seed(self):
        ZeroLossMessageService().persist_messages([(f"e{i}", "emails", {"i": i}) for i in range(4)])
        make_stuck(["s1", "s2"], queue="emails")
        make_dead(["d1"], queue="sms")
        make_completed(["c1"], queue="sms")

    def test_table(self):
        self.seed()
        r = run("zeroloss_status")
        assert r.code == 0
        lines = r.out.splitlines()
        # A column per status, in Status's order, then the stuck leases and the oldest pending age.
        assert lines[0].split() == ["queue", *Status.values, "stuck", "oldest", "pending"]
        width = len(Status.values) + 1
        rows = {
            line.split()[0]: dict(zip([*Status.values, "stuck"], line.split()[1:], strict=False))
            for line in lines[2:5]
        }
        shown = {name: {k: int(v) for k, v in row.items()} for name, row in rows.items()}
        assert all(len(row) == width for row in rows.values()), rows
        assert shown == {
            "emails": NONE | {"pending": 4, "processing": 2, "stuck": 2},
            "sms": NONE | {"completed": 1, "dead": 1, "stuck": 0},
            "(all)": NONE | {"pending": 4, "processing": 2, "completed": 1, "dead": 1, "stuck": 2},
        }
        assert "replication: met" in r.out
        assert "nodes: 0 live, 0 down" in r.out
        assert r.err == ""

    def test_json_schema_and_values(self):
        self.seed()
        r = run("zeroloss_status", "--json")
        assert r.code == 0
        data = json.loads(r.out)
        assert set(data) == STATUS_KEYS
        assert data["totals"] == NONE | {"pending": 4, "processing": 2, "completed": 1, "dead": 1}
        assert (data["total"], data["stuck"], data["dead"]) == (8, 2, 1)
        assert [q["name"] for q in data["queues"]] == ["emails", "sms"]
        for q in data["queues"]:
            assert set(q) == QUEUE_KEYS
        emails = data["queues"][0]
        assert emails["counts"] == NONE | {"pending": 4, "processing": 2}
        assert emails["stuck"] == 2
        assert emails["oldest_pending_age"] >= 0
        assert data["queues"][1]["oldest_pending_age"] is None  # nothing pending in sms
        assert data["nodes"] == {"live": 0, "down": 0}
        assert data["replication"] == {"required": 0, "available": 0, "ok": True, "problems": []}
        assert data["sweep"] == {"runs": 0, "requeued": 0, "dead_lettered": 0}
        assert (data["blocked_keys"], data["blocked_keys_truncated"]) == ([], False)
        assert data["cached"] is False

    def test_queue_filter(self):
        self.seed()
        data = json.loads(run("zeroloss_status", "--queue", "sms", "--json").out)
        assert [q["name"] for q in data["queues"]] == ["sms"]
        assert data["totals"] == NONE | {"completed": 1, "dead": 1}
        table = run("zeroloss_status", "--queue", "sms").out
        assert "emails" not in table
        assert "(all)" not in table

    def test_sweep_history_comes_from_the_audit_trail(self):
        self.seed()
        report = ZeroLossMessageService(instance_id="sweeper").sweep()
        assert sorted(report.requeued) == ["s1", "s2"]
        data = json.loads(run("zeroloss_status", "--json", "--no-cache").out)
        assert data["sweep"] == {"runs": 1, "requeued": 2, "dead_lettered": 0}
        assert data["stuck"] == 0

    def test_cached_until_no_cache(self):
        self.seed()
        first = json.loads(run("zeroloss_status", "--json").out)
        ZeroLossMessageService().persist_message("late", "emails", {})
        cached = json.loads(run("zeroloss_status", "--json").out)
        assert cached["cached"] is True
        assert cached["total"] == first["total"] == 8
        fresh = json.loads(run("zeroloss_status", "--json", "--no-cache").out)
        assert (fresh["cached"], fresh["total"]) == (False, 9)

    def test_watch_prints_one_json_line_per_refresh(self):
        self.seed()
        r = run("zeroloss_status", "--watch", "0.05", "--count", "3", "--json")
        assert r.code == 0
        lines = r.out.strip().splitlines()
        assert len(lines) == 3
        docs = [json.loads(line) for line in lines]
        assert all(set(d) == STATUS_KEYS and d["total"] == 8 and not d["cached"] for d in docs)

    def test_watch_table(self):
        self.seed()
        r = run("zeroloss_status", "--watch", "0.05", "--count", "2", "--queue", "emails")
        assert r.code == 0
        assert r.out.count("queue  ") == 2

    @pytest.mark.parametrize(
        ("args", "match"),
        [
            (["--queue", "nope"], "unknown queue 'nope'"),
            (["--watch", "0"], "invalid number"),
            (["--watch", "-1"], "invalid number"),
            (["--count", "2"], "--count needs --watch"),
            (["--watch", "1", "--count", "-1"], "invalid number"),
            (["--database", "other"], "unknown database alias 'other'"),
        ],
    )
    def test_bad_arguments(self, args, match):
        self.seed()
        assert_usage_error("zeroloss_status", *args, match=match)

    def test_empty_ledger(self):
        data = json.loads(run("zeroloss_status", "--json").out)
        assert (data["queues"], data["total"], data["oldest_pending_age"]) == ([], 0, None)
        assert_usage_error("zeroloss_status", "--queue", "q", match="the ledger is empty")


# -- zeroloss_requeue ---------------------------------------------------------------------


@pytest.mark.django_db
class TestRequeueByIds:
    def test_requeues_stuck_and_redrives_dead_exactly_once(self):
        make_stuck(["s1"])
        make_dead(["d1"])
        r = run("zeroloss_requeue", "s1", "d1", "--json")
        assert r.code == 0, r
        data = json.loads(r.out)
        assert set(data) == REQUEUE_KEYS
        assert sorted(data["requeued"]) == ["d1", "s1"]
        assert data["skipped"] == []
        assert data["selection"]["ids"] == ["s1", "d1"]
        assert statuses() == {"s1": "pending", "d1": "pending"}
        events = MessageEvent.objects.filter(reason__in=["requeued_by_operator", "redriven_by_operator"])
        assert events.count() == 2
        assert all(e.actor.startswith("cli:zeroloss_requeue@") for e in events)
        # Again: nothing is stuck or dead now, so nothing moves and exit code 1 says so.
        again = run("zeroloss_requeue", "s1", "d1", "--json")
        assert again.code == 1
        assert json.loads(again.out)["requeued"] == []
        assert events.count() == 2

    def test_live_lease_needs_force(self):
        tokens = make_leased(["live"])
        r = run("zeroloss_requeue", "live", "--json")
        assert r.code == 1
        assert json.loads(r.out)["skipped"] == [
            {"message_id": "live", "status": "processing", "reason": "lease is live (use --force)"}
        ]
        assert statuses() == {"live": "processing"}
        forced = run("zeroloss_requeue", "live", "--force", "--json")
        assert forced.code == 0
        assert json.loads(forced.out)["requeued"] == ["live"]
        assert json.loads(forced.out)["force"] is True
        # Fencing: the revoked worker can no longer acknowledge.
        assert ZeroLossMessageService().acknowledge("live", tokens["live"]) is False

    def test_pending_and_completed_are_skipped(self):
        make_completed(["done"])
        ZeroLossMessageService().persist_message("waiting", "q", {})
        make_stuck(["s1"])
        r = run("zeroloss_requeue", "done", "waiting", "s1")
        assert r.code == 1
        assert "requeued 1 of 3" in r.out
        assert "message is completed" in r.out and "message is pending" in r.out
        assert "not requeued" in r.err
        assert statuses() == {"done": "completed", "waiting": "pending", "s1": "pending"}

    def test_dry_run_changes_nothing(self):
        make_stuck(["s1"])
        make_dead(["d1"])
        make_leased(["live"])
        before = ledger_state()
        r = run("zeroloss_requeue", "s1", "d1", "live", "--dry-run", "--json")
        assert r.code == 1  # "live" would be skipped
        data = json.loads(r.out)
        assert data["dry_run"] is True
        assert sorted(data["requeued"]) == ["d1", "s1"]
        assert [s["message_id"] for s in data["skipped"]] == ["live"]
        assert ledger_state() == before
        table = run("zeroloss_requeue", "s1", "d1", "--dry-run")
        assert table.code == 0
        assert "would requeue 2 of 2" in table.out
        assert ledger_state() == before

    def test_many_ids_need_confirmation(self):
        ids = [f"d{i}" for i in range(101)]
        make_dead(ids)
        before = ledger_state()
        refused = run("zeroloss_requeue", *ids)
        assert refused.code == 3
        assert "stdin is not a terminal" in refused.err
        assert ledger_state() == before
        said_no = run("zeroloss_requeue", *ids, stdin=FakeTerminal("no\n"))
        assert said_no.code == 3
        assert "Requeue 101 messages? Type 'yes'" in said_no.err
        assert ledger_state() == before
        said_yes = run("zeroloss_requeue", *ids, "--json", stdin=FakeTerminal("yes\n"))
        assert said_yes.code == 0
        assert len(json.loads(said_yes.out)["requeued"]) == 101
        assert set(statuses().values()) == {"pending"}

    def test_few_ids_do_not_ask(self):
        make_dead([f"d{i}" for i in range(100)])
        assert run("zeroloss_requeue", *[f"d{i}" for i in range(100)]).code == 0

    @pytest.mark.parametrize(
        ("args", "match"),
        [
            (["nope"], "unknown message id(s): 'nope'"),
            (["s1", "nope"], "unknown message id(s): 'nope'"),
            (["s1", "--queue", "q"], "not both"),
            (["s1", "--state", "stuck"], "not both"),
            (["s1", "--limit", "3"], "apply to a --queue/--state selection"),
            (["s1", "--older-than", "1h"], "apply to a --queue/--state selection"),
            ([], "give message IDs"),
            (["--queue", "q"], "--queue and --state go together"),
            (["--state", "dead"], "--queue and --state go together"),
            (["--queue", "q", "--state", "stuck", "--force"], "--force applies to message IDs"),
            (["--queue", "q", "--state", "stuck", "--limit", "-1"], "invalid number '-1'"),
            (["--queue", "q", "--state", "stuck", "--limit", "0"], "invalid number '0'"),
            (["--queue", "q", "--state", "stuck", "--older-than", "10 minutes"], "invalid duration"),
            (["--queue", "q", "--state", "stuck", "--older-than=-5m"], "invalid duration"),
            (["--queue", "q", "--state", "sleepy"], "invalid choice: 'sleepy'"),
            (["--queue", "nope", "--state", "dead", "--yes"], "unknown queue 'nope'"),
        ],
    )
    def test_bad_arguments_change_nothing(self, args, match):
        make_stuck(["s1"])
        assert_usage_error("zeroloss_requeue", *args, match=match)


@pytest.mark.django_db
class TestRequeueSelection:
    def test_stuck_selection_with_yes(self):
        make_stuck(["s1", "s2"], queue="q")
        make_stuck(["other"], queue="q2")
        make_leased(["live"], queue="q")
        r = run("zeroloss_requeue", "--queue", "q", "--state", "stuck", "--yes", "--json")
        assert r.code == 0, r
        data = json.loads(r.out)
        assert sorted(data["requeued"]) == ["s1", "s2"]
        assert data["selection"] == {
            "ids": None,
            "queue": "q",
            "state": "stuck",
            "older_than_seconds": None,
            "limit": None,
        }
        assert data["matched"] == 2
        assert statuses() == {"s1": "pending", "s2": "pending", "other": "processing", "live": "processing"}
        assert MessageEvent.objects.filter(reason="requeued_by_operator").count() == 2

    def test_dead_selection_limit_oldest_first(self):
        make_dead(["d1", "d2", "d3"])
        r = run("zeroloss_requeue", "--queue", "q", "--state", "dead", "--limit", "2", "--yes", "--json")
        assert r.code == 0
        assert json.loads(r.out)["requeued"] == ["d1", "d2"]
        assert statuses() == {"d1": "pending", "d2": "pending", "d3": "dead"}

    def test_older_than_uses_the_database_clock(self):
        make_dead(["old", "new"])
        assert backdate(["old"], "dead_at", seconds_ago=120) == 1  # dead-lettered 2 min ago
        dry = run(
            "zeroloss_requeue",
            "--queue",
            "q",
            "--state",
            "dead",
            "--older-than",
            "60s",
            "--dry-run",
            "--json",
        )
        assert json.loads(dry.out)["requeued"] == ["old"]
        r = run(
            "zeroloss_requeue", "--queue", "q", "--state", "dead", "--older-than", "60s", "--yes", "--json"
        )
        data = json.loads(r.out)
        assert (data["requeued"], data["selection"]["older_than_seconds"]) == (["old"], 60.0)
        assert statuses() == {"old": "pending", "new": "dead"}
        none = run("zeroloss_requeue", "--queue", "q", "--state", "dead", "--older-than", "1h", "--json")
        assert none.code == 0
        assert json.loads(none.out)["matched"] == 0

    def test_selection_is_confirmed_even_when_small(self):
        make_stuck(["s1"])
        before = ledger_state()
        refused = run("zeroloss_requeue", "--queue", "q", "--state", "stuck")
        assert refused.code == 3
        assert "Refusing without --yes" in refused.err
        assert ledger_state() == before
        said_no = run("zeroloss_requeue", "--queue", "q", "--state", "stuck", stdin=FakeTerminal("n\n"))
        assert said_no.code == 3
        assert ledger_state() == before
        said_yes = run("zeroloss_requeue", "--queue", "q", "--state", "stuck", stdin=FakeTerminal("y\n"))
        assert said_yes.code == 0
        assert "requeued 1 of 1" in said_yes.out
        assert statuses() == {"s1": "pending"}

    def test_dry_run_changes_nothing(self):
        make_stuck(["s1", "s2"])
        before = ledger_state()
        r = run("zeroloss_requeue", "--queue", "q", "--state", "stuck", "--dry-run", "--limit", "1", "--json")
        assert r.code == 0
        data = json.loads(r.out)
        assert (data["dry_run"], data["matched"], data["requeued"]) == (True, 1, ["s1"])
        assert ledger_state() == before

    def test_a_message_the_sweep_took_first_is_not_moved_twice(self):
        make_stuck(["s1", "s2"])
        ZeroLossMessageService(instance_id="sweeper").sweep()
        r = run("zeroloss_requeue", "--queue", "q", "--state", "stuck", "--yes", "--json")
        assert json.loads(r.out)["matched"] == 0
        assert MessageEvent.objects.filter(reason="requeued_by_operator").count() == 0
        assert MessageEvent.objects.filter(reason="lease_expired").count() == 2


# -- zeroloss_purge -----------------------------------------------------------------------


@pytest.mark.django_db
class TestPurge:
    def test_purges_completed_in_batches_and_verify_stays_balanced(self):
        make_completed([f"c{i}" for i in range(7)], queue="a")
        make_completed(["b1"], queue="b")
        make_dead(["d1"], queue="a")
        ZeroLossMessageService().persist_message("p1", "a", {})
        r = run("zeroloss_purge", "--older-than", "0s", "--batch-size", "3", "--yes", "--json")
        assert r.code == 0, r
        data = json.loads(r.out)
        assert set(data) == PURGE_KEYS
        assert (data["matched"], data["purged"], data["by_queue"]) == (8, 8, {"a": 7, "b": 1})
        assert (data["status"], data["batch_size"], data["dry_run"]) == ("completed", 3, False)
        assert statuses() == {"d1": "dead", "p1": "pending"}
        assert sum(PurgeRecord.objects.values_list("count", flat=True)) == 8
        assert PurgeRecord.objects.count() >= 3  # one record per queue per batch
        # Their audit rows went with them; the conservation check still balances.
        assert not MessageEvent.objects.exclude(message__in=Message.objects.all()).exists()
        verify = json.loads(run("zeroloss_verify", "--json").out)
        assert verify["conservation"]["balanced"] is True
        assert verify["conservation"]["purged"] == 8
        assert verify["status"] == "ok"

    def test_dead_status_queue_and_limit(self):
        make_dead(["a1", "a2", "a3"], queue="a")
        make_dead(["b1"], queue="b")
        r = run(
            "zeroloss_purge",
            "--older-than",
            "0s",
            "--status",
            "dead",
            "--queue",
            "a",
            "--limit",
            "2",
            "--yes",
            "--json",
        )
        assert r.code == 0
        data = json.loads(r.out)
        assert (data["purged"], data["by_queue"], data["queue"], data["limit"]) == (2, {"a": 2}, "a", 2)
        assert statuses() == {"a3": "dead", "b1": "dead"}
        assert list(PurgeRecord.objects.values_list("queue_name", "status", "count")) == [("a", "dead", 2)]

    def test_cancelled_ages_by_when_it_was_cancelled(self):
        # A cancelled message has no dead_at: it is aged by updated_at, as retention ages it.
        service = ZeroLossMessageService()
        for mid in ("x1", "x2"):
            service.persist_message(mid, "a", {})
        service.cancel_messages(["x1", "x2"])
        assert backdate(["x1"], "updated_at", seconds_ago=120) == 1
        r = run("zeroloss_purge", "--older-than", "30s", "--status", "cancelled", "--yes", "--json")
        assert r.code == 0, r
        assert (json.loads(r.out)["matched"], json.loads(r.out)["purged"]) == (1, 1)
        assert statuses() == {"x2": "cancelled"}

    def test_older_than_keeps_recent_messages(self):
        make_completed(["old", "new"])
        assert backdate(["old"], "completed_at", seconds_ago=120) == 1  # completed 2 min ago
        r = run("zeroloss_purge", "--older-than", "30s", "--yes")
        assert r.code == 0
        assert "purged 1 completed message(s) older than 30s (before " in r.out
        assert statuses() == {"new": "completed"}

    def test_dry_run_changes_nothing(self):
        make_completed(["c1", "c2"], queue="a")
        make_completed(["c3"], queue="b")
        before = ledger_state()
        r = run("zeroloss_purge", "--older-than", "0s", "--dry-run", "--json")
        data = json.loads(r.out)
        assert (r.code, data["dry_run"], data["matched"], data["purged"]) == (0, True, 3, 0)
        assert data["by_queue"] == {"a": 2, "b": 1}
        limited = json.loads(
            run("zeroloss_purge", "--older-than", "0s", "--dry-run", "--limit", "2", "--json").out
        )
        assert (limited["matched"], sum(limited["by_queue"].values())) == (2, 2)
        table = run("zeroloss_purge", "--older-than", "0s", "--dry-run")
        assert "would purge 3 completed message(s)" in table.out
        assert ledger_state() == before

    def test_refused_confirmation_changes_nothing(self):
        make_completed(["c1"])
        before = ledger_state()
        refused = run("zeroloss_purge", "--older-than", "0s")
        assert refused.code == 3
        assert "Refusing without --yes because stdin is not a terminal" in refused.err
        said_no = run("zeroloss_purge", "--older-than", "0s", stdin=FakeTerminal("nope\n"))
        assert said_no.code == 3
        assert ledger_state() == before
        said_yes = run("zeroloss_purge", "--older-than", "0s", stdin=FakeTerminal("yes\n"))
        assert said_yes.code == 0
        assert statuses() == {}

    def test_nothing_to_purge_asks_nothing(self):
        ZeroLossMessageService().persist_message("p", "q", {})
        r = run("zeroloss_purge", "--older-than", "0s", "--json")
        assert r.code == 0
        assert json.loads(r.out)["matched"] == 0

    @pytest.mark.parametrize(
        ("args", "match"),
        [
            ([], "the following arguments are required: --older-than"),
            (["--older-than", "7days"], "invalid duration"),
            (["--older-than", "7d", "--status", "pending"], "invalid choice: 'pending'"),
            (["--older-than", "7d", "--batch-size", "0"], "invalid number '0'"),
            (["--older-than", "7d", "--batch-size", "-10"], "invalid number '-10'"),
            (["--older-than", "7d", "--limit", "-1"], "invalid number '-1'"),
            (["--older-than", "0s", "--queue", "nope", "--yes"], "unknown queue 'nope'"),
        ],
    )
    def test_bad_arguments_change_nothing(self, args, match):
        make_completed(["c1"])
        assert_usage_error("zeroloss_purge", *args, match=match)


# -- zeroloss_verify ----------------------------------------------------------------------


@pytest.mark.django_db
class TestVerify:
    def test_clean_ledger_is_ok(self):
        make_completed(["c1"])
        make_leased(["live"])
        ZeroLossMessageService().persist_message("p1", "q", {"x": [1, 2.5]})
        r = run("zeroloss_verify", "--json")
        assert r.code == 0, r
        data = json.loads(r.out)
        assert set(data) == VERIFY_KEYS
        assert (data["status"], data["exit_code"], data["issues"], data["issues_total"]) == ("ok", 0, [], 0)
        assert data["integrity"] == {
            "messages_checked": 3,
            "sampled": False,
            "replication_checked": False,
            "checksum_mismatch": 0,
            "stuck": 0,
            "attempts_exceeded": 0,
            "replication_insufficient": 0,
        }
        c = data["conservation"]
        assert (c["persisted"], c["accounted"], c["balanced"]) == (3, 3, True)
        assert (c["pending"], c["processing"], c["completed"], c["dead"], c["purged"]) == (1, 1, 1, 0, 0)
        assert (c["orphan_events"], c["missing_persisted_event"], c["duplicate_persisted_event"]) == (0, 0, 0)
        assert c["status_mismatch"] == 0
        table = run("zeroloss_verify")
        assert table.code == 0
        assert "zeroloss_verify: OK" in table.out
        assert "balanced" in table.out

    def test_stuck_is_a_warning(self):
        make_stuck(["s1"])
        r = run("zeroloss_verify", "--json")
        assert r.code == 1
        data = json.loads(r.out)
        assert (data["status"], data["exit_code"], data["integrity"]["stuck"]) == ("warning", 1, 1)
        assert data["issues"][0]["check"] == "stuck"
        assert data["issues"][0]["message_id"] == "s1"
        assert data["issues"][0]["severity"] == "warning"

    def test_dead_letters_above_threshold_are_a_warning(self, settings):
        make_dead(["d1", "d2"])
        assert run("zeroloss_verify").code == 0
        settings.ZEROLOSS = {**settings.ZEROLOSS, "HEALTH_MAX_DEAD": 1}
        r = run("zeroloss_verify", "--json")
        assert r.code == 1
        data = json.loads(r.out)
        assert data["dead_letters"] == {"count": 2, "max": 1}
        assert data["issue_counts"] == {"dead_letters": 1}

    def test_checksum_mismatch_is_critical(self):
        ZeroLossMessageService().persist_message("m1", "q", {"amount": 10})
        # Simulates corruption behind the ledger's back (a bad restore, a manual UPDATE).
        Message.objects.filter(message_id="m1").update(payload={"amount": 1000})
        r = run("zeroloss_verify", "--json")
        assert r.code == 2
        data = json.loads(r.out)
        assert data["status"] == "critical"
        assert data["issue_counts"] == {"checksum_mismatch": 1}
        assert data["issues"][0]["message_id"] == "m1"
        assert "critical" in r.err

    def test_conservation_discrepancies_are_each_reported(self):
        svc = ZeroLossMessageService()
        svc.persist_messages([(f"m{i}", "q", {"i": i}) for i in range(4)])
        # Simulated damage: a deleted message (orphans its audit row, unbalances the ledger),
        # a status changed without an audit row, and a duplicated 'persisted' row.
        Message.objects.filter(message_id="m0").delete()
        Message.objects.filter(message_id="m1").update(status=Status.COMPLETED)
        m2 = Message.objects.get(message_id="m2")
        MessageEvent.objects.create(
            message=m2,
            to_status="pending",
            reason="persisted",
            actor="rogue",
            created_at=m2.created_at,
            message_created_at=m2.created_at,
        )
        MessageEvent.objects.filter(message__message_id="m3").delete()
        r = run("zeroloss_verify", "--json")
        assert r.code == 2
        data = json.loads(r.out)
        assert data["issue_counts"] == {
            "orphan_event": 1,
            "status_mismatch": 2,  # m1 (completed vs pending) and m3 (no audit row at all)
            "duplicate_persisted_event": 1,
            "missing_persisted_event": 1,
            "unbalanced": 1,
        }
        c = data["conservation"]
        # 4 persisted events remain (m0's orphan, m1, m2 twice); 3 messages remain.
        assert (c["persisted_events"], c["persisted"], c["accounted"], c["balanced"]) == (4, 4, 3, False)
        by_check = {i["check"]: i for i in data["issues"]}
        assert by_check["duplicate_persisted_event"]["message_id"] == "m2"
        assert by_check["missing_persisted_event"]["message_id"] == "m3"
        assert by_check["orphan_event"]["message_id"] is None
        assert "refers to missing message" in by_check["orphan_event"]["detail"]
        assert {i["message_id"] for i in data["issues"] if i["check"] == "status_mismatch"} == {"m1", "m3"}
        assert all(i["severity"] == "critical" for i in data["issues"])

    def test_unbalanced_totals_alone_are_critical(self):
        ZeroLossMessageService().persist_messages([("a", "q", {}), ("b", "q", {})])
        # A purge record with no purge behind it: the books no longer balance.
        from django.utils import timezone

        PurgeRecord.objects.create(
            queue_name="q", status="completed", count=5, actor="x", purged_at=timezone.now()
        )
        data = json.loads(run("zeroloss_verify", "--json").out)
        assert data["conservation"]["balanced"] is True  # persisted and accounted both count purges
        Message.objects.filter(message_id="a").delete()
        MessageEvent.objects.filter(message__message_id="b").exclude(reason="persisted").delete()
        data = json.loads(run("zeroloss_verify", "--json").out)
        assert data["issue_counts"]["unbalanced"] == 1
        assert data["exit_code"] == 2

    def test_sample_queue_and_max_issues(self):
        svc = ZeroLossMessageService()
        svc.persist_messages([(f"a{i}", "a", {"i": i}) for i in range(10)])
        svc.persist_messages([(f"b{i}", "b", {"i": i}) for i in range(3)])
        data = json.loads(run("zeroloss_verify", "--sample", "4", "--json").out)
        assert data["integrity"]["messages_checked"] == 4
        assert data["integrity"]["sampled"] is True
        assert data["conservation"]["status_checked"] == 4
        data = json.loads(run("zeroloss_verify", "--queue", "b", "--json").out)
        assert (data["queue"], data["integrity"]["messages_checked"]) == ("b", 3)
        assert data["conservation"]["persisted"] == 3
        assert data["conservation"]["orphans_checked"] is False
        Message.objects.filter(queue_name="a").update(payload={"tampered": True})
        data = json.loads(run("zeroloss_verify", "--max-issues", "2", "--json").out)
        assert (data["issues_total"], len(data["issues"]), data["issues_truncated"]) == (10, 2, True)
        assert data["issue_counts"] == {"checksum_mismatch": 10}
        assert json.loads(run("zeroloss_verify", "--queue", "b", "--json").out)["status"] == "ok"

    def test_replication(self, settings):
        ZeroLossMessageService().persist_message("m1", "q", {})
        data = json.loads(run("zeroloss_verify", "--replication", "--json").out)
        assert data["integrity"]["replication_checked"] is True
        assert data["status"] == "ok"
        # Two copies required, and no standby streams here (or SQLite keeps one copy).
        settings.ZEROLOSS = {**settings.ZEROLOSS, "REPLICATION_FACTOR": 2}
        r = run("zeroloss_verify", "--replication", "--json")
        assert r.code == 2
        data = json.loads(r.out)
        assert data["replication"]["ok"] is False
        assert data["issue_counts"]["replication_requirement"] == 1
        assert data["issue_counts"]["replication_insufficient"] == 1
        without = json.loads(run("zeroloss_verify", "--json").out)
        assert "replication_insufficient" not in without["issue_counts"]
        assert without["exit_code"] == 2  # the requirement itself is still unmet

    @pytest.mark.parametrize(
        ("args", "match"),
        [
            (["--sample", "0"], "invalid number '0'"),
            (["--sample", "-3"], "invalid number '-3'"),
            (["--sample", "many"], "invalid number 'many'"),
            (["--max-issues", "0"], "invalid number '0'"),
            (["--queue", "nope"], "unknown queue 'nope'"),
            (["--database", "replica"], "unknown database alias"),
        ],
    )
    def test_bad_arguments(self, args, match):
        ZeroLossMessageService().persist_message("m1", "q", {})
        assert_usage_error("zeroloss_verify", *args, match=match)


# -- the command line ---------------------------------------------------------------------


@pytest.mark.django_db
class TestCommandLine:
    def test_exit_codes(self):
        make_stuck(["s1"], queue="q")
        make_completed(["c1"], queue="q")
        before = ledger_state()

        status = command_line("zeroloss_status", "--json")
        assert status.code == 0, status.err
        assert json.loads(status.out)["stuck"] == 1
        assert status.err == ""

        bad = command_line("zeroloss_status", "--queue", "nope")
        assert bad.code == 2
        assert "usage: manage.py zeroloss_status" in bad.err
        assert "error: unknown queue 'nope'" in bad.err
        assert bad.out == ""

        warn = command_line("zeroloss_verify", "--json")
        assert warn.code == 1
        assert json.loads(warn.out)["status"] == "warning"
        assert "WarningFound" in warn.err

        for args in (
            ["zeroloss_purge", "--older-than", "soon"],
            ["zeroloss_purge", "--older-than", "1d", "--limit", "-2"],
            ["zeroloss_requeue", "s1", "--queue", "q"],
            ["zeroloss_requeue", "--queue", "q", "--state", "stuck", "--older-than", "1y"],
            ["zeroloss_verify", "--sample", "-1"],
        ):
            r = command_line(*args)
            assert r.code == 2, (args, r.err)
            assert "error:" in r.err
        assert ledger_state() == before

        refused = command_line("zeroloss_purge", "--older-than", "0s")
        assert refused.code == 3
        assert "NotConfirmed" in refused.err and "--yes" in refused.err
        piped = command_line("zeroloss_requeue", "--queue", "q", "--state", "stuck", input="yes\n")
        assert piped.code == 3  # a pipe is not a terminal, whatever it says
        assert ledger_state() == before

        partial = command_line("zeroloss_requeue", "s1", "c1")
        assert partial.code == 1
        assert "requeued 1 of 2" in partial.out

        Message.objects.filter(message_id="c1").update(payload={"changed": 1})
        critical = command_line("zeroloss_verify")
        assert critical.code == 2
        assert "CRITICAL" in critical.out

        done = command_line("zeroloss_purge", "--older-than", "0s", "--yes", "--json")
        assert done.code == 0
        assert json.loads(done.out)["purged"] == 1

    def test_terminal_prompt_and_progress_bar(self):
        make_completed([f"c{i}" for i in range(30)])
        before = ledger_state()
        args = ("zeroloss_purge", "--older-than", "0s", "--batch-size", "10")
        refused = command_line(*args, input="no\n", tty=True)
        assert refused.code == 3, refused.err
        assert "Purge 30 completed message(s)" in refused.err
        assert ledger_state() == before
        done = command_line(*args, input="yes\n", tty=True)
        assert done.code == 0, done.err
        assert "purge [" in done.out and "30/30" in done.out  # the bar, drawn on the terminal
        assert "purged 30 completed message(s)" in done.out
        assert Message.objects.count() == 0

    def test_no_progress_bar_when_stdout_is_not_a_terminal(self):
        make_completed([f"c{i}" for i in range(30)])
        r = command_line("zeroloss_purge", "--older-than", "0s", "--batch-size", "10", "--yes")
        assert r.code == 0
        assert "[" not in r.out and "\r" not in r.out
        assert r.out.startswith("purged 30 completed message(s)")


@pytest.mark.process
@pytest.mark.django_db(transaction=True)
def test_prompt_and_progress_bar_on_a_real_terminal():
    make_completed([f"c{i}" for i in range(30)])
    code, output = cli_tty("zeroloss_purge", "--older-than", "0s", "--batch-size", "10", answer="yes")
    assert code == 0, output
    assert "Purge 30 completed message(s)" in output
    assert "purge [" in output and "30/30" in output
    assert Message.objects.count() == 0


def test_database_vendor_is_supported():
    assert connection.vendor in ("postgresql", "sqlite")
