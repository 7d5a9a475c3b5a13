"""System checks: exact check objects, stable ids."""

from __future__ import annotations

import pytest
from django.core.checks import Error, Warning
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection

from zeroloss.ops import checks


def ids(messages):
    return [m.id for m in messages]


def test_defaults_are_clean(settings):
    assert checks.check_settings() == []


@pytest.mark.parametrize(
    ("value", "check_id", "text"),
    [
        ([1], "zeroloss.E001", "must be a dict"),
        ({"ACK_TIMEOUTS": 3}, "zeroloss.E002", "unknown setting"),
        ({"ACK_TIMEOUT": 0}, "zeroloss.E003", "'ACK_TIMEOUT'"),
        ({"ACK_TIMEOUT": "5"}, "zeroloss.E003", "number of seconds"),
        ({"MAX_ATTEMPTS": 0}, "zeroloss.E003", "'MAX_ATTEMPTS'"),
        ({"MAX_ATTEMPTS": 2.5}, "zeroloss.E003", "integer"),
        ({"PERSISTENCE_LEVEL": "eventual"}, "zeroloss.E003", "one of"),
        ({"RETRY_BACKOFF": {"BASE": 10, "MAX": 1}}, "zeroloss.E003", "MAX"),
        ({"RETRY_BACKOFF": {"BASEE": 1}}, "zeroloss.E003", "RETRY_BACKOFF"),
        ({"REPLICATION_FACTOR": 0}, "zeroloss.E003", "REPLICATION_FACTOR"),
        ({"MAX_PAYLOAD_BYTES": -1}, "zeroloss.E003", "MAX_PAYLOAD_BYTES"),
        ({"TELEMETRY": "yes"}, "zeroloss.E003", "'TELEMETRY']: must be True or False"),
    ],
)
def test_invalid_settings_are_errors(settings, value, check_id, text):
    settings.ZEROLOSS = value
    [message] = checks.check_settings()
    assert isinstance(message, Error)
    assert message.id == check_id
    assert text in message.msg
    assert message.obj == "settings.ZEROLOSS"


def test_invalid_settings_fail_manage_py_check(settings):
    settings.ZEROLOSS = {"ACK_TIMEOUT": -5}
    with pytest.raises(SystemCheckError, match=r"zeroloss\.E003"):
        call_command("check")


def test_sweep_interval_longer_than_ack_timeout_warns(settings):
    settings.ZEROLOSS = {"ACK_TIMEOUT": 5, "SWEEP_INTERVAL": 60}
    assert checks.check_settings() == [
        Warning(
            "SWEEP_INTERVAL (60s) is longer than ACK_TIMEOUT (5s): orphaned messages wait up to a whole "
            "sweep interval after their lease expired.",
            hint="Set ZEROLOSS['SWEEP_INTERVAL'] to at most ACK_TIMEOUT (a third of it is a good start).",
            obj="settings.ZEROLOSS",
            id="zeroloss.W001",
        )
    ]


def test_heartbeat_not_shorter_than_ack_timeout_warns(settings):
    settings.ZEROLOSS = {"ACK_TIMEOUT": 5, "HEARTBEAT_INTERVAL": 5, "SWEEP_INTERVAL": 1}
    assert ids(checks.check_settings()) == ["zeroloss.W002"]


def test_backend_checks_match_the_database(settings):
    settings.ZEROLOSS = {"PERSISTENCE_LEVEL": "replicated", "REPLICATION_FACTOR": 2}
    found = ids(checks.check_backend())
    if connection.vendor == "sqlite":
        assert found == ["zeroloss.E010"]
        settings.ZEROLOSS = {"REPLICATION_FACTOR": 2}
        assert ids(checks.check_backend()) == ["zeroloss.W011"]
    else:
        assert found == []


def test_sqlite_without_immediate_mode_warns():
    from zeroloss.conf import ZeroLossSettings

    [warning] = checks.backend_messages("default", "sqlite", {"timeout": 5}, ZeroLossSettings())
    assert warning.id == "zeroloss.W003"
    assert warning.hint is not None and "transaction_mode" in warning.hint
    assert (
        checks.backend_messages("default", "sqlite", {"transaction_mode": "IMMEDIATE"}, ZeroLossSettings())
        == []
    )


def test_unsupported_database_is_an_error():
    [error] = checks.backend_messages("default", "mysql", {}, None)
    assert (error.id, error.msg) == (
        "zeroloss.E004",
        "Database 'default' is mysql; zeroloss supports PostgreSQL and SQLite.",
    )


@pytest.mark.django_db
def test_database_check_reports_missing_standbys(settings):
    settings.ZEROLOSS = {"REPLICATION_FACTOR": 2}
    found = checks.check_database(databases=["default"])
    if connection.vendor == "postgresql":
        [warning] = found
        assert warning.id == "zeroloss.W010"
        assert "Only 0 streaming standby(s); REPLICATION_FACTOR=2 needs 1." in warning.msg
    else:
        assert found == []
    assert checks.check_database(databases=None) == []


def test_a_ledger_routed_to_an_unknown_database_is_an_error(settings):
    settings.ZEROLOSS = {"QUEUE_DATABASES": {"reports": "ledger9"}}
    assert checks.check_settings() == [
        Error(
            "ZEROLOSS names the database alias 'ledger9', which is not in DATABASES.",
            hint="Add it to DATABASES, or fix QUEUE_DATABASES / LEDGER_DATABASES.",
            obj="settings.ZEROLOSS",
            id="zeroloss.E011",
        )
    ]
