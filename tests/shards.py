"""The PostgreSQL pass's shards: ``python -m tests.suite`` runs them side by side (with the SQLite
pass), each its own pytest process with ``--postgres-shard N`` (tests/conftest.py), database,
Redis database and var dir.

The pass is mostly waiting (worker processes, private servers, timeouts): one process over every
file spent ~1400 s of wall for ~770 s of CPU, so shards running at once fill the two cores.

Shards 2 and 3 are explicit lists of files, balanced by their measured times in the PostgreSQL
pass (seconds, one process under CI's load; in brackets, or with "~", beside the other shards
on a 2-core machine shared with other test runs, load average ~12); shard 1 is every other file, so a new test file runs in shard 1
without a change here. Move a file when a shard grows past the others (``pytest --durations``,
or each shard's time in ``make test``'s summary).
"""

from __future__ import annotations

#: The fault suite, the benchmark suite, the fault fixtures, pg_auto_failover (private clusters,
#: standbys, monitors, network namespaces, a redis-server of their own) and the docs' examples.
SHARD_3 = (
    "test_faults.py",  # 308 (441)
    "test_benchmarks.py",  # 151 (over 280)
    "test_infra_fixtures.py",  # (59)
    "test_failover.py",  # 84 (under 33)
    "test_doc_claims.py",  # (58)
    "test_production_docs.py",  # (50)
    "test_docs.py",  # (44)
)

#: Worker processes (Celery workers over the shared Redis, the browser, the process pool, the
#: demo), PostgreSQL's standbys and poolers.
SHARD_2 = (
    "test_transport.py",  # 108 (210)
    "test_ordering_processes.py",  # with test_abort_processes: 86 (275)
    "test_abort_processes.py",
    "test_schedules_processes.py",  # 122 (145)
    "test_process_pool.py",  # 106 (93)
    "test_queue_limits_processes.py",  # 54 (94)
    "test_processes.py",  # (56)
    "test_demo.py",  # (44)
    "test_several_ledgers.py",  # (38)
    "test_admin_browser.py",  # 74 (29)
    "test_pgbouncer.py",  # (under 33 each, these three)
    "test_replication.py",
    "test_schedules_failover.py",
)

# Shard 1 is the ledger tier (many short files: test_admin_actions 61, test_everyday_ops 59,
# test_admin_keys 46 ... in brackets) and the remaining process and chaos files. Before the
# files marked (...) here moved out of it, it took over 1,550 s where shards 2 and 3 took 771 s
# and 841 s.

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
