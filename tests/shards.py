"""The PostgreSQL pass's shards: ``python -m tests.suite`` runs them side by side (with the SQLite
pass), each its own pytest process with ``--postgres-shard N`` (tests/conftest.py), database,
Redis database and var dir.

The pass is mostly waiting (worker processes, private servers, timeouts): one process over every
file spent ~1400 s of wall for ~770 s of CPU, so shards running at once fill the two cores.

Shards 2 and 3 are explicit lists of files, balanced by their measured times in the PostgreSQL
pass (seconds, one process under CI's load; "~": measured on a loaded 2-core machine and halved); shard 1 is every other file, so a new test file runs in shard 1
without a change here. Move a file when a shard grows past the others (``pytest --durations``,
or each shard's time in ``make test``'s summary).
"""

from __future__ import annotations

#: The fault suite, the benchmark suite and the fault fixtures: private clusters, standbys,
#: PgBouncer, network namespaces, a redis-server of their own.
SHARD_3 = (
    "test_faults.py",  # 308
    "test_benchmarks.py",  # 151
    "test_infra_fixtures.py",  # ~70
)

#: Worker processes: Celery workers over the shared Redis, the browser, the process pool.
SHARD_2 = (
    "test_schedules_processes.py",  # 122
    "test_transport.py",  # 108
    "test_process_pool.py",  # 106
    "test_abort_processes.py",  # with test_ordering_processes: 86
    "test_ordering_processes.py",
    "test_admin_browser.py",  # 74
)

# Shard 1, besides the ledger and most process files (~190 s together), takes the rest of
# PostgreSQL's own machinery: test_failover (84), test_pgbouncer (~60), test_replication (~50),
# test_schedules_failover (~50), test_queue_limits_processes (54).

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
