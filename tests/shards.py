"""The PostgreSQL pass's shards: ``python -m tests.suite`` runs them side by side (with the SQLite
pass), each its own pytest process with ``--postgres-shard N`` (tests/conftest.py), database,
Redis database and var dir.

The pass is mostly waiting (worker processes, private servers, timeouts): one process over every
file spent ~1400 s of wall for ~770 s of CPU, so shards running at once fill the two cores.

Shards 2 and 3 are explicit lists of files, balanced by their measured times in the PostgreSQL
pass (seconds, under CI's load); shard 1 is every other file, so a new test file runs in shard 1
without a change here. Move a file when a shard grows past the others (``pytest --durations``,
or each shard's time in ``make test``'s summary).
"""

from __future__ import annotations

#: The fault suite and PostgreSQL's own machinery under faults: private clusters, standbys,
#: pg_auto_failover, PgBouncer (none of them uses the shared Redis but test_faults' Celery
#: transport, which starts its own redis-server).
SHARD_3 = (
    "test_faults.py",  # 308
    "test_benchmarks.py",  # 151
    "test_failover.py",  # 84
    "test_replication.py",
    "test_infra_fixtures.py",
    "test_pgbouncer.py",
    "test_schedules_failover.py",
)

#: Worker processes: Celery workers over the shared Redis, the browser, the process pool.
SHARD_2 = (
    "test_schedules_processes.py",  # 122
    "test_transport.py",  # 108
    "test_process_pool.py",  # 106
    "test_abort_processes.py",  # with test_ordering_processes: 86
    "test_ordering_processes.py",
    "test_admin_browser.py",  # 74
    "test_queue_limits_processes.py",  # 54
)

#: How many shards there are; shard 1 is every file in neither list.
COUNT = 3
EXPLICIT = {2: SHARD_2, 3: SHARD_3}


def shard_of(filename: str) -> int:
    """The shard a test file (its base name, ``test_x.py``) runs in."""
    for shard, files in EXPLICIT.items():
        if filename in files:
            return shard
    return 1


def database_for(url: str, shard: int) -> str:
    """Shard ``shard``'s PostgreSQL URL: the first shard's database name with the shard's number
    appended (``.../zeroloss`` -> ``.../zeroloss2``); shard 1 keeps ``url``."""
    if shard == 1:
        return url
    from urllib.parse import urlparse

    parsed = urlparse(url)
    return parsed._replace(path=f"{parsed.path.rstrip('/') or '/zeroloss'}{shard}").geturl()
