"""The settings of storing messages: persistence and replication, limits and retention, health
thresholds and periodic messages (the later tables of ``docs/settings.md``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .setting_values import (
    DEFAULT_RETENTION,
    anything,
    choice,
    flag,
    integer,
    json_encoder_path,
    partition_period,
    retention,
    seconds,
    setting,
)


@dataclass(frozen=True)
class ReplicationSettings:
    """Persistence and replication."""

    PERSISTENCE_LEVEL: str = setting(
        "durable",
        choice("durable", "replicated"),
        """`"durable"`: persisting returns once committed on the primary. `"replicated"`: also
        once `REPLICATION_FACTOR - 1` streaming standbys have replayed it, measured
        ([replication.md](replication.md)).""",
    )
    REPLICATION_FACTOR: int = setting(
        1,
        integer(1),
        """Copies a message must have, the primary included. Checked by
        `verify_message_integrity`, `zeroloss_verify`, the health check and
        `zeroloss.W010`/`W011`.""",
        unit="copies",
    )
    REPLICATION_TIMEOUT: float = setting(
        5.0,
        seconds(),
        """How long a `"replicated"` persist waits for standbys before raising
        `ReplicationTimeout` (the message is committed on the primary; retrying is safe).""",
    )
    NODE_TTL: float = setting(
        30.0,
        seconds(),
        """A replication node not seen for this long is shown as down (kept, not deleted).""",
    )


@dataclass(frozen=True)
class LimitSettings:
    """Limits, retention, performance."""

    MAX_PAYLOAD_BYTES: int = setting(
        256 * 1024,
        integer(1, 256 * 1024 * 1024),
        """Largest payload, measured as canonical UTF-8 JSON; larger ones raise `PayloadTooLarge`
        and nothing is stored.""",
        unit="bytes",
        note="256 KiB",
    )
    MAX_HEADERS_BYTES: int = setting(
        8 * 1024,
        integer(1, 1024 * 1024),
        """Largest headers (`send(..., headers=...)`), measured as UTF-8 JSON; larger ones raise
        `HeadersTooLarge` and nothing is stored ([headers.md](headers.md#what-headers-may-hold)).""",
        unit="bytes",
        note="8 KiB",
    )
    JSON_ENCODER: str | None = setting(
        None,
        json_encoder_path(),
        """Encodes what JSON has no type for in payloads, headers and stored results, e.g.
        `"django.core.serializers.json.DjangoJSONEncoder"` for `datetime`, `Decimal` and `UUID`
        (stored as strings). `None`: such values raise `InvalidPayload`. A path that cannot be
        imported or names something else is `zeroloss.E005`
        ([headers.md](headers.md#json_encoder-datetime-decimal-uuid)).""",
        check_id="zeroloss.E005",
    )
    DEDUP_WINDOW: float = setting(
        300.0,
        seconds(),
        """The default window of `send(..., dedup_key=...)`: a second send of the same queue and
        key within it returns the first message instead of storing another
        ([ordering.md](ordering.md#deduplication-windows)).""",
        note="5 minutes",
    )
    RETENTION: dict[str, float | None] = setting(
        DEFAULT_RETENTION,
        retention(fill=True),
        """How long finished messages are kept before the workers remove them on their own; a
        queue's own in `QUEUES[q]["retention"]`. [Retention](#retention) says how.""",
        check_id="zeroloss.E008",
        shown='`{"completed": "7d", "cancelled": "7d", "dead": "30d"}`',
    )
    COMPLETED_RETENTION: float = setting(
        7 * 24 * 3600.0,
        seconds(),
        """The default age for `service.cleanup_completed_messages()` and the admin's purge
        action; when a project sets it and not `RETENTION`, also `RETENTION["completed"]`.""",
        note="7 days",
    )
    DEAD_LETTER_RETENTION: float | None = setting(
        None,
        seconds(none=True),
        """A partitioned ledger (PostgreSQL): how old a dead letter must be to go with its period
        when `zeroloss_purge` of completed messages drops the period whole
        ([scaling.md](scaling.md#retention-by-partition)). `None`: a period holding any dead
        letter is kept (its completed messages are purged row by row, as on SQLite);
        `zeroloss_purge --status dead` purges dead letters by hand either way. When a project sets
        it and not `RETENTION`, also `RETENTION["dead"]`.""",
    )
    PARTITION_PERIOD: float = setting(
        24 * 3600.0,
        partition_period(),
        """A partitioned ledger (PostgreSQL): one partition of messages and one of their audit
        rows per period, aligned on UTC midnight. Read when partitions are created (the migration,
        the sweep, `service.ensure_partitions()`): a change applies to the periods created after
        it. Shorter periods drop sooner and make smaller partitions; each attached partition costs
        every statement that cannot prune to one a look at its indexes, so keep
        `COMPLETED_RETENTION / PARTITION_PERIOD + PARTITIONS_AHEAD` in the tens, not thousands.""",
        note="a day",
    )
    PARTITIONS_AHEAD: int = setting(
        3,
        integer(1),
        """A partitioned ledger: the sweep (at most once a minute per process) creates the periods
        missing from now's to this many ahead, and a send that finds fewer than half of them left
        creates them itself ([partitions that never run
        out](scaling.md#partitions-that-never-run-out)): no send fails for want of a partition,
        with or without a sweep. `check --database default` (`zeroloss.W042`) and the health check
        warn when they end within three days (or half of them, when shorter). Every partition
        attached costs a claim a lock on it and each of its indexes (a generic plan locks them
        all before it prunes): 3 ahead rather than 7 took a drain on a backlog from 223 relation
        locks a claim to 127 ([scaling.md](scaling.md#retention-by-partition)).""",
        unit="periods",
    )
    PREPARED_STATEMENTS: bool = setting(
        True,
        flag(),
        """PostgreSQL: prepare the hot-path statements once per connection (the fenced batch
        statements are planned for each batch and never prepared: a generic plan cannot know the
        batch's size). Set `False` behind a pooler in transaction (or statement) mode that does
        not keep prepared statements: PgBouncer before 1.21 never does, and 1.21+ only with
        `max_prepared_statements > 0` (0, off, by default in 1.21–1.23; 200 from 1.24). Behind
        transaction pooling also run `zeroloss_worker --no-listen`: `LISTEN` lands on whichever
        server connection ran it, so wake-ups are silently lost and workers fall back to polling
        every `--poll-interval` ([production.md](production.md#pgbouncer)).""",
    )
    LISTEN: bool = setting(
        True,
        flag(),
        """PostgreSQL: each `zeroloss_worker` keeps one extra connection that `LISTEN`s, so a new
        message wakes idle workers at once. Set `False` behind a transaction-pooling PgBouncer,
        where `LISTEN` cannot work (workers then poll every `--poll-interval`; `--no-listen` does
        the same for one worker).""",
    )
    TELEMETRY: bool = setting(
        True,
        flag(),
        """Record spans (with `opentelemetry-api` installed: `zeroloss[otel]`) and the event
        counters and histograms (with `prometheus-client`, and OpenTelemetry metrics when a meter
        provider is set) of every send, handler run and outcome
        ([observability.md](observability.md)). Without those packages it changes nothing and
        imports nothing. `False`: none of it is recorded (the ledger gauges of
        `/zeroloss/metrics/` stay).""",
    )
    CACHE_TIMEOUT: float = setting(
        5.0,
        seconds(zero=True),
        """How old the snapshot read by `zeroloss_status`, the dashboard, metrics and the health
        check may be (Django's `default` cache); `0` disables the cache. Transitions never read
        it.""",
    )


@dataclass(frozen=True)
class HealthSettings:
    """Health thresholds."""

    HEALTH_MAX_STUCK: int = setting(
        0,
        integer(0),
        """The health check fails above this many stuck messages (processing with an expired
        lease).""",
        unit="messages",
    )
    HEALTH_MAX_DEAD: int = setting(
        100,
        integer(0),
        """The health check fails, and `zeroloss_verify` warns (exit code 1), above this many dead
        letters.""",
        unit="messages",
    )


@dataclass(frozen=True)
class ScheduleSettings:
    """Periodic messages."""

    SCHEDULES: dict[str, Any] = setting(
        {},
        anything("dict of name → schedule"),
        """Periodic messages, exactly once per tick: each key of a schedule (`queue` or `task`,
        `cron` or `every`, `timezone`, `payload`, `args`/`kwargs`, `priority`, `ordering_key`,
        `enabled`, `catch_up`, `max_catch_up`, `overlap`) is described in
        [schedules.md](schedules.md#every-key); errors are `zeroloss.E050`–`E058`.""",
    )
    SCHEDULE_INTERVAL: float = setting(
        1.0,
        seconds(),
        """How often a scheduler round runs: in each `zeroloss_worker` (unless `--no-schedule`),
        in `zeroloss_schedule --loop`, and as the Celery beat entry (`scheduler_beat_entry()`,
        which `beat_schedule_entry()` includes). A tick's message is at most about this late, and
        a database schedule's change is noticed within it.""",
    )
