"""PostgreSQL server checks (``manage.py check --database default``): E040, W040, W041.

The exact check objects are asserted from the readings; the readings themselves come from real
servers: the test database (a session with ``synchronous_commit = off``), and a private
PostgreSQL started for the test with ``fsync = off`` and a database whose default is
``synchronous_commit = off``, checked by a real ``manage.py check`` process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.core.checks import Error, Warning
from django.db import connection, connections

from tests.conftest import ROOT, child_env
from tests.infra.pgcluster import PgCluster
from zeroloss.ops import checks

E040 = Error(
    "Database 'default' is PostgreSQL 12 (server_version_num 120017); zeroloss needs PostgreSQL 14 or "
    "newer (DETACH PARTITION ... CONCURRENTLY, gen_random_uuid()).",
    hint="Upgrade the server to PostgreSQL 14 or newer.",
    obj="settings.DATABASES",
    id="zeroloss.E040",
)
W040 = Warning(
    "Database 'default' runs with fsync = off: a crash of the server or its host can lose or corrupt "
    'committed messages, so "durable" is not.',
    hint="Set fsync = on in postgresql.conf and reload the server (zeroloss documentation: Operating > "
    'Production, section "PostgreSQL settings").',
    obj="settings.DATABASES",
    id="zeroloss.W040",
)
W041 = Warning(
    "Database 'default': synchronous_commit = off for zeroloss's connection: a commit returns before it is "
    "flushed, so a server crash can lose messages send() already returned, and acknowledgements (handlers "
    "then run again).",
    hint="Use synchronous_commit = on (or local, remote_write, remote_apply) for the role, the database and "
    "the connection OPTIONS zeroloss uses (zeroloss documentation: Operating > Production, section "
    '"PostgreSQL settings").',
    obj="settings.DATABASES",
    id="zeroloss.W041",
)


def test_a_supported_durable_server_is_clean():
    assert checks.postgres_messages("default", 150020, "on", "on") == []
    assert checks.postgres_messages("default", 140000, "on", "remote_apply") == []
    # "local" and "remote_write" still flush the primary's WAL before the commit returns.
    assert checks.postgres_messages("default", 170002, "on", "local") == []
    assert checks.postgres_messages("default", 160004, "on", "remote_write") == []


def test_each_reading_has_its_exact_check():
    assert checks.postgres_messages("default", 120017, "on", "on") == [E040]
    assert checks.postgres_messages("default", 150020, "off", "on") == [W040]
    assert checks.postgres_messages("default", 150020, "on", "off") == [W041]
    assert checks.postgres_messages("default", 120017, "off", "off") == [E040, W040, W041]


def test_versions_before_10_are_named_with_their_two_part_major():
    [error] = checks.postgres_messages("ledger2", 90624, "on", "on")
    assert error.id == "zeroloss.E040"
    assert error.msg.startswith("Database 'ledger2' is PostgreSQL 9.6 (server_version_num 90624)")


def test_the_checks_are_database_checks():
    from django.core.checks import registry

    database_checks = registry.registry.get_checks(include_deployment_checks=False)
    tagged = [c for c in database_checks if "database" in getattr(c, "tags", ())]
    assert checks.check_database in tagged
    assert checks.check_database(databases=None) == []  # plain `manage.py check` asks nothing


@pytest.mark.postgres_only
@pytest.mark.django_db
def test_the_test_server_is_clean_and_a_session_without_synchronous_commit_warns():
    from django.db.backends.postgresql.base import DatabaseWrapper

    wrapper = connections["default"]
    assert isinstance(wrapper, DatabaseWrapper)  # postgres_only: narrows the type for pg_version
    version, fsync, synchronous_commit = checks.postgres_readings("default")
    assert version == wrapper.pg_version and version >= checks.MIN_POSTGRES_VERSION_NUM
    assert (fsync, synchronous_commit) == ("on", "on")
    assert checks.check_database(databases=["default"]) == []
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")  # what OPTIONS {"options": "-c ..."} would do
    try:
        assert checks.check_database(databases=["default"]) == [W041]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET synchronous_commit")
    assert checks.check_database(databases=["default"]) == []


@pytest.mark.sqlite_only
@pytest.mark.django_db
def test_sqlite_is_not_asked(django_assert_num_queries):
    assert connection.vendor == "sqlite"
    with django_assert_num_queries(0):
        assert checks.check_database(databases=["default"]) == []


@pytest.mark.postgres_only
@pytest.mark.process  # a private cluster and manage.py check
def test_manage_py_check_names_a_server_without_fsync_and_a_database_without_synchronous_commit():
    cluster = PgCluster(dbname="zl_checks")
    try:
        cluster.start()
        with cluster.connect(dbname="postgres") as conn:
            conn.execute("ALTER SYSTEM SET fsync = off")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute("ALTER DATABASE zl_checks SET synchronous_commit = off")
        with cluster.connect() as conn:  # a new session sees both
            assert conn.execute("SHOW fsync").fetchone() == ("off",)
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
        env = child_env(DATABASE_URL=cluster.url())
        plain = subprocess.run(
            [sys.executable, "manage.py", "check"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert plain.returncode == 0, plain.stderr
        assert "zeroloss.W04" not in plain.stdout + plain.stderr  # needs --database
        done = subprocess.run(
            [sys.executable, "manage.py", "check", "--database", "default"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        out = done.stdout + done.stderr
        assert done.returncode == 0, out  # warnings, not errors
        assert "(zeroloss.W040) Database 'default' runs with fsync = off" in out
        assert "(zeroloss.W041) Database 'default': synchronous_commit = off" in out
        assert "zeroloss.E040" not in out
    finally:
        cluster.stop()
