"""The HA and PgBouncer test fixtures do what they claim (groundwork for automatic failover
and connection pooling). Real servers, real SIGKILL/SIGSTOP, real PgBouncer; nothing mocked.

The two HA tests share one cluster (starting it is most of their cost); the async test runs
first because the failover test leaves the cluster without a standby.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db.utils import ConnectionHandler

from tests.infra.hacluster import HaCluster
from tests.infra.pgbouncer import PgBouncer, ensure_pgbouncer, pgbouncer_version
from tests.infra.pgcluster import ClusterError, PgCluster
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow, pytest.mark.once]


@pytest.fixture(scope="module")
def ha() -> Iterator[HaCluster]:
    cluster = HaCluster(dbname="zl_ha")
    try:
        seconds = cluster.start()
        print(f"\nHA cluster (monitor + primary + sync standby) started in {seconds:.1f}s")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def pgb_cluster() -> Iterator[PgCluster]:
    """One server for the module's PgBouncer tests: what they dirty (server connections, their
    SETs and prepared statements) lives in the pooler's connections and ends with it."""
    cluster = PgCluster(dbname="zl_pgb")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def bouncer(pgb_cluster: PgCluster) -> Iterator[PgBouncer]:
    pooler = PgBouncer("127.0.0.1", pgb_cluster.primary_port, "zl_pgb", pool_mode="transaction")
    try:
        seconds = pooler.start()
        print(f"\nPgBouncer accepted a query {seconds:.2f}s after start")
        yield pooler
    finally:
        pooler.stop()


class CommitInThread:
    """One autocommit INSERT on ``port``, run in a thread so the test can watch it wait."""

    def __init__(self, port: int, sql: str) -> None:
        self.port, self.sql = port, sql
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with psycopg.connect(
                host="127.0.0.1", port=self.port, dbname="zl_ha", user="postgres", autocommit=True
            ) as conn:
                conn.execute(self.sql)
        except BaseException as exc:
            self.error = exc

    def done(self, timeout: float) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()


def waiting_on_sync_rep(port: int, sql: str, timeout: float) -> bool:
    """Whether a backend running ``sql`` on ``port`` is seen waiting on SyncRep within ``timeout``."""
    with psycopg.connect(
        host="127.0.0.1", port=port, dbname="zl_ha", user="postgres", autocommit=True
    ) as conn:

        def seen() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND query = %s", [sql]
            ).fetchone()
            return bool(row and row[0])

        return bool(wait_until(seen, timeout))


def django_wrapper(entry: dict[str, Any]) -> Any:
    """A Django connection built from a DATABASES entry exactly as Django builds its own."""
    return ConnectionHandler({"default": entry})["default"]


# -- HA: pg_auto_failover --------------------------------------------------------------------


def test_ha_async_mode_commits_stop_waiting_for_the_standby(ha: HaCluster) -> None:
    _host, primary = ha.primary()
    with psycopg.connect(ha.dsn_multi(), autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS mode_probe (id serial PRIMARY KEY, mode text)")

    # synchronous (the fixture's default): with the standby frozen (SIGSTOP) a commit waits for
    # its flush acknowledgement (wait event SyncRep) and completes once the standby runs again
    names, rows = ha.replication()
    assert names.startswith("ANY 1 (") and [r[2] for r in rows] == ["quorum"]
    sql = "INSERT INTO mode_probe (mode) VALUES ('sync')"
    with ha.paused_standby():
        commit = CommitInThread(primary, sql)
        assert waiting_on_sync_rep(primary, sql, timeout=2.0)
        assert not commit.done(timeout=0.2)
    assert commit.done(timeout=30) and commit.error is None

    ha.set_synchronous(False)
    names, rows = ha.replication()
    assert names == ""
    assert [r[2] for r in rows] == ["async"]
    sql = "INSERT INTO mode_probe (mode) VALUES ('async')"
    with ha.paused_standby():
        commit = CommitInThread(primary, sql)
        assert commit.done(timeout=2.0) and commit.error is None  # returned with the standby frozen

    ha.set_synchronous(True)
    names, rows = ha.replication()
    assert names.startswith("ANY 1 (") and [r[2] for r in rows] == ["quorum"]


def test_ha_failover_keeps_synchronous_commits_and_accepts_writes(
    ha: HaCluster, django_db_blocker: Any
) -> None:
    ha.set_synchronous(True)
    _host, old_port = ha.primary()
    with psycopg.connect(ha.dsn_multi(), autocommit=True) as conn:
        assert conn.info.port == old_port  # libpq skipped the read-only standby
        conn.execute("CREATE TABLE failover_rows (id int PRIMARY KEY, phase text NOT NULL)")
        for i in range(200):  # 200 commits, each returned only after the standby flushed it
            conn.execute("INSERT INTO failover_rows VALUES (%s, 'before')", [i])

    with django_db_blocker.unblock():
        wrapper = django_wrapper(ha.django_database())
        try:
            with wrapper.cursor() as cursor:
                cursor.execute("SELECT inet_server_port(), pg_is_in_recovery()")
                assert cursor.fetchone() == (old_port, False)
        finally:
            wrapper.close()

    _killed_host, killed_port = ha.kill_primary()
    assert killed_port == old_port
    with pytest.raises(psycopg.OperationalError):  # nothing of the old primary is serving
        psycopg.connect(
            host="127.0.0.1", port=killed_port, dbname="zl_ha", user="postgres", connect_timeout=2
        )
    seconds = ha.wait_for_failover(timeout=120)
    print(f"\nfailover: {seconds:.1f}s from SIGKILL of the primary to the first accepted write")

    _host, new_port = ha.primary()
    assert new_port != old_port
    with psycopg.connect(ha.dsn_multi(), autocommit=True) as conn:
        assert conn.info.port == new_port
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
        rows = conn.execute("SELECT id FROM failover_rows WHERE phase = 'before' ORDER BY id").fetchall()
        assert [r[0] for r in rows] == list(range(200))
        conn.execute("INSERT INTO failover_rows VALUES (1000, 'after')")
        assert conn.execute("SELECT count(*) FROM failover_rows").fetchone() == (201,)

    with django_db_blocker.unblock():
        wrapper = django_wrapper(ha.django_database())
        try:
            with wrapper.cursor() as cursor:
                cursor.execute("SELECT inet_server_port(), pg_is_in_recovery()")
                assert cursor.fetchone() == (new_port, False)
                cursor.execute("INSERT INTO failover_rows VALUES (1001, 'django')")
        finally:
            wrapper.close()


# -- PgBouncer 1.18, transaction pooling ------------------------------------------------------


def test_pgbouncer_pools_per_transaction(bouncer: PgBouncer) -> None:
    config = {row["key"]: row["value"] for row in bouncer.show("CONFIG")}
    assert config["pool_mode"] == "transaction"
    marker = "SELECT current_setting('zl.marker', true), current_setting('TimeZone'), pg_backend_pid()"

    with bouncer.connect() as a, bouncer.connect() as b:
        a.execute("SET zl.marker = 'from-a'")  # session-level SET, autocommit: the server goes back
        a.execute("SET TIME ZONE 'Asia/Tokyo'")  # to the pool after each statement
        a_marker, a_zone, a_server = a.execute(marker).fetchone() or (None, None, None)
        assert (a_marker, a_zone) == ("from-a", "Asia/Tokyo")
        with b.transaction():
            # b is handed a's server connection (the only idle one) and sees a's setting...
            b_marker, b_zone, b_server = b.execute(marker).fetchone() or (None, None, None)
            assert b_server == a_server
            assert b_marker == "from-a"
            assert b_zone != "Asia/Tokyo"  # ...except TimeZone, which PgBouncer tracks per client
            # ...while a, needing a server now, gets a fresh one where its SET never happened
            a_marker, a_zone, a_server_now = a.execute(marker).fetchone() or (None, None, None)
            assert a_server_now != a_server
            assert a_marker is None
            assert a_zone == "Asia/Tokyo"

        # LISTEN registers on whichever server connection ran it, not on the client
        a.execute("LISTEN zl_channel")
        b.execute("NOTIFY zl_channel, 'hello'")
        assert list(a.notifies(timeout=1.0, stop_after=1)) == []

    # reload() applies a changed ini: in session mode the SET stays with its client
    bouncer.pool_mode = "session"
    bouncer.reload()
    assert {r["key"]: r["value"] for r in bouncer.show("CONFIG")}["pool_mode"] == "session"
    with bouncer.connect() as a, bouncer.connect() as b:
        a.execute("SET zl.marker = 'from-a'")
        with b.transaction():
            assert b.execute(marker).fetchone()[0] is None  # type: ignore[index]
            assert a.execute(marker).fetchone()[0] == "from-a"  # type: ignore[index]


def test_pgbouncer_breaks_server_side_prepared_statements(bouncer: PgBouncer) -> None:
    query = "SELECT %s::int + 1"
    with bouncer.connect() as a, bouncer.connect() as b:
        assert a.execute(query, [1], prepare=True).fetchone() == (2,)  # prepared on server S1
        with b.transaction():
            b.execute("SELECT 1")  # b now holds S1
            with pytest.raises(psycopg.errors.InvalidSqlStatementName, match="does not exist"):
                a.execute(query, [2], prepare=True)  # Bind to the statement name, on server S2
            assert a.execute(query, [3], prepare=False).fetchone() == (4,)  # unnamed: fine

    # psycopg prepares on its own after prepare_threshold (5) executions of one query; Django
    # turns that off (prepare_threshold=None) unless OPTIONS ask for it. Here it does not even
    # take an interleaving: the server connection a new client gets still holds the name the
    # previous client prepared (transaction mode runs no DISCARD ALL between clients).
    with bouncer.connect() as a:
        for i in range(5):
            assert a.execute(query, [i]).fetchone() == (i + 1,)  # sent unnamed
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement, match="_pg3_0"):
            a.execute(query, [5])  # the 6th: psycopg prepares it as "_pg3_0"
    with bouncer.connect(prepare_threshold=None) as a, bouncer.connect() as b:
        for i in range(6):
            a.execute(query, [i])
        with b.transaction():
            b.execute("SELECT 1")
            assert a.execute(query, [7]).fetchone() == (8,)


def test_pgbouncer_max_prepared_statements_needs_1_21() -> None:
    ensure_pgbouncer()
    pooler = PgBouncer("127.0.0.1", 1, "zl_pgb", max_prepared_statements=100)
    try:
        if pgbouncer_version() < (1, 21):
            with pytest.raises(ClusterError, match=r"1\.21"):
                pooler.start(timeout=5)
            assert pooler.proc is None
        else:  # a newer PgBouncer starts with it; this test then only checks the config file
            pooler.write_config()
            assert "max_prepared_statements = 100" in pooler.ini.read_text()
    finally:
        pooler.stop()
        pooler.stop()  # safe twice
    assert not pooler.root.exists()
