"""The ``ZEROLOSS`` setting: one typed object whose attributes are the defaults.

Projects set a dict in their Django settings::

    ZEROLOSS = {"ACK_TIMEOUT": 30, "MAX_ATTEMPTS": 5}

:func:`get_settings` validates it and returns a frozen :class:`ZeroLossSettings`.
Invalid values raise :class:`~django.core.exceptions.ImproperlyConfigured` at use and
are reported by ``manage.py check`` with stable ids (see :mod:`zeroloss.checks`).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .conf_values import (
    DEFAULT_RETENTION,
    INT_FIELDS,
    NUMBER_FIELDS,
    QUEUE_OPTIONS,
    SettingError,
    is_printable,
    parse_integer,
    parse_json_encoder,
    parse_number,
    parse_partition_period,
    parse_retention,
)
from .conf_values import MAX_SECONDS as MAX_SECONDS  # public: the longest duration a setting may name
from .ledger import validation as _validation
from .rates import Rate
from .states import Status

PERSISTENCE_LEVELS = ("durable", "replicated")
TRANSPORTS = ("database", "celery")


@dataclass(frozen=True)
class RetryBackoff:
    """Exponential backoff after a failed attempt, with full jitter: a delay drawn uniformly
    from 0 to ``min(BASE * 2 ** (attempt - 1), MAX)`` seconds, so the messages one incident
    failed together do not all retry together (``JITTER: False``: exactly the bound)."""

    BASE: float = 1.0
    MAX: float = 300.0
    JITTER: bool = True

    def bound_for(self, attempt: int) -> float:
        """The longest delay after failed attempt ``attempt``: ``min(BASE * 2 ** (attempt - 1), MAX)``."""
        # Cap the exponent so a large attempt count cannot overflow a float.
        return float(min(self.BASE * (2 ** min(max(attempt - 1, 0), 60)), self.MAX))

    def delay_for(self, attempt: int, rng: random.Random | None = None) -> float:
        """The delay before the retry of failed attempt ``attempt`` (``rng``: for tests)."""
        bound = self.bound_for(attempt)
        if not self.JITTER:
            return bound
        # Not for secrets: spreading retries over time only needs them to differ.
        return (rng or _jitter).uniform(0.0, bound)


_jitter = random.Random()


@dataclass(frozen=True)
class QueueSettings:
    """One queue declared in ``ZEROLOSS["QUEUES"]``: ``{"emails": {}}``.

    A declared queue may be sent to by a process that does not import its handler (a web image
    without the workers' code); ``zeroloss_worker`` refuses to run one it has no handler for.
    Its options are this class's fields; each is validated by the parser named in
    :data:`QUEUE_OPTIONS`, so adding one is a field and a parser. The limits
    (docs/control.md) may be overridden at run time by ``zeroloss_queue limit``."""

    #: At most this many messages of the queue processing at once, across every worker.
    concurrency: int | None = None
    #: At most this many claims started per period, across every worker.
    rate: Rate | None = None
    #: How long this queue's finished messages are kept, by status (those it names; the others
    #: as ``RETENTION`` says).
    retention: dict[str, float | None] | None = None


@dataclass(frozen=True)
class ZeroLossSettings:
    """Every zeroloss setting, with its default. Units are seconds unless named otherwise."""

    #: Lease length. A worker that does not acknowledge or renew within it loses the message.
    ACK_TIMEOUT: float = 5.0
    #: How often a worker renews its lease while a handler runs (default: ACK_TIMEOUT / 3).
    HEARTBEAT_INTERVAL: float | None = None
    #: Attempts (claims) before a message is dead-lettered.
    MAX_ATTEMPTS: int = 5
    #: Delay before a failed message becomes claimable again.
    RETRY_BACKOFF: RetryBackoff = field(default_factory=RetryBackoff)
    #: Times one message's handlers may raise ``zeroloss.Snooze`` without counting an attempt;
    #: past it each snooze is a failed attempt (so a message cannot snooze for ever).
    MAX_SNOOZES: int = 100
    #: "durable" (committed on the primary) or "replicated" (also confirmed by standbys).
    PERSISTENCE_LEVEL: str = "durable"
    #: Copies a message must have, the primary included.
    REPLICATION_FACTOR: int = 1
    #: How long "replicated" persistence waits for standbys before raising ReplicationTimeout.
    REPLICATION_TIMEOUT: float = 5.0
    #: A replication node not seen for this long counts as down.
    NODE_TTL: float = 30.0
    #: How often the recovery sweep runs (beat task, sweep loop, built-in worker).
    SWEEP_INTERVAL: float = 2.0
    #: Messages one sweep transaction moves at most.
    SWEEP_BATCH_SIZE: int = 1000
    #: A pending message not claimed for this long is published to the broker again.
    REDISPATCH_AFTER: float = 30.0
    #: "database": workers poll the ledger (``zeroloss_worker``), no broker. "celery": ``send``
    #: publishes a Celery task after commit and the sweep publishes again what the broker lost.
    TRANSPORT: str = "database"
    #: Queues whose ledger lives in another database: ``{"reports": "ledger2"}``. Every other
    #: queue's is ``default``. ``send`` routes by it; workers and sweeps run per database.
    QUEUE_DATABASES: dict[str, str] = field(default_factory=dict)
    #: Queues declared without needing their handler in this process: ``{"emails": {}}``
    #: (queue name -> its options). ``send`` accepts them in a process that does not import the
    #: handler (a web/worker split); ``zeroloss_worker`` refuses one it has no handler for.
    QUEUES: dict[str, QueueSettings] = field(default_factory=dict)
    #: Database aliases holding a ledger (besides those ``QUEUE_DATABASES`` routes to). The Celery
    #: transport's sweep covers each; ``send`` refuses any other alias under Celery.
    LEDGER_DATABASES: tuple[str, ...] = ("default",)
    #: The Celery queue beat sends the sweep to (None: Celery's default queue).
    SWEEP_QUEUE: str | None = "zeroloss.sweep"
    #: Celery transport: the longest one wait on the broker may take while publishing (connect,
    #: each send); the first failure leaves the rest to the next sweep.
    PUBLISH_TIMEOUT: float = 2.0
    #: Outcomes recorded together (one statement per kind) at most; and the longest an
    #: outcome waits for its batch, in seconds.
    ACK_BATCH_SIZE: int = 100
    ACK_FLUSH_INTERVAL: float = 0.05
    #: Seconds a process keeps retrying an unreachable database before it exits (None: forever).
    DB_OUTAGE_TOLERANCE: float | None = None
    #: A handler running longer than this (seconds) stops having its lease renewed: the message
    #: goes to another worker after its lease expires, and this run's outcome is refused.
    HANDLER_TIMEOUT: float | None = None
    #: How long a database session of a worker process may go unanswered before each end
    #: gives it up (TCP keepalives and ``tcp_user_timeout``, set on the server and, unless the
    #: project set its own, on the client): a cut-off or dead worker's transaction, and every
    #: lock in it, ends within this bound. None: leave both ends to the system defaults.
    DEAD_PEER_TIMEOUT: float | None = 10.0
    #: Async handlers of one claimed batch awaited at once by one worker thread.
    ASYNC_CONCURRENCY: int = 10
    #: How long finished messages are kept before the workers' maintenance removes them, by
    #: status, in seconds (None: for ever); a queue's own in ``QUEUES[q]["retention"]``
    #: (docs/settings.md#retention). Unset: these defaults, with ``COMPLETED_RETENTION`` and
    #: ``DEAD_LETTER_RETENTION`` when the project sets them.
    RETENTION: dict[str, float | None] = field(default_factory=lambda: dict(DEFAULT_RETENTION))
    #: Completed messages older than this are purged by ``cleanup_completed_messages``.
    COMPLETED_RETENTION: float = 7 * 24 * 3600.0
    #: Dead letters older than this may go with their period when a purge of completed messages
    #: drops it (a partitioned ledger, docs/scaling.md). None: a period holding a dead letter is
    #: kept whole (its completed messages are purged row by row); ``zeroloss_purge --status dead``
    #: purges dead letters by hand either way.
    DEAD_LETTER_RETENTION: float | None = None
    #: A partitioned ledger's period (PostgreSQL): one partition of messages and audit rows per
    #: period, in seconds: whole hours dividing a day, or whole days. Read when partitions are
    #: created (the migration, the sweep); changing it applies to partitions created after.
    PARTITION_PERIOD: float = 24 * 3600.0
    #: Periods the sweep keeps created ahead of now: sends fail once none covers now.
    PARTITIONS_AHEAD: int = 7
    #: Default deduplication window for ``send(..., dedup_key=...)``, in seconds.
    DEDUP_WINDOW: float = 300.0
    #: Largest accepted payload, in bytes of canonical UTF-8 JSON.
    MAX_PAYLOAD_BYTES: int = 256 * 1024
    #: Largest accepted headers (``send(..., headers=...)``), in bytes of UTF-8 JSON.
    MAX_HEADERS_BYTES: int = 8 * 1024
    #: Dotted path of a ``json.JSONEncoder`` subclass whose ``default()`` turns what JSON has no
    #: type for into JSON (``"django.core.serializers.json.DjangoJSONEncoder"``: ``datetime``,
    #: ``Decimal``, ``UUID``), in payloads and results. None: such values are refused.
    JSON_ENCODER: str | None = None
    #: Prepare the hot-path statements once per PostgreSQL connection. Turn off behind a
    #: pooler that cannot keep prepared statements (PgBouncer < 1.21 in transaction mode).
    PREPARED_STATEMENTS: bool = True
    #: Built-in workers LISTEN for wake-ups on PostgreSQL (one extra connection each). Turn off
    #: behind a transaction-pooling PgBouncer, where LISTEN cannot work: workers then poll.
    LISTEN: bool = True
    #: Record spans (``opentelemetry-api`` installed) and event metrics (``prometheus_client``
    #: and/or an OpenTelemetry meter provider) of every send, handler run and outcome
    #: (docs/observability.md). Without those packages it costs nothing either way.
    TELEMETRY: bool = True
    #: Seconds that status, dashboard, metrics and health reads may be cached (0 disables).
    CACHE_TIMEOUT: float = 5.0
    #: Thresholds for the health check: above them the check fails.
    HEALTH_MAX_STUCK: int = 0
    HEALTH_MAX_DEAD: int = 100
    #: Periodic messages, by name (docs/schedules.md); validated by :mod:`zeroloss.schedules.spec`
    #: and reported by ``manage.py check`` (zeroloss.E050-E058), so kept raw here.
    SCHEDULES: dict[str, Any] = field(default_factory=dict)
    #: How often a scheduler round runs (worker, ``zeroloss_schedule --loop``, Celery beat).
    SCHEDULE_INTERVAL: float = 1.0

    @property
    def heartbeat_interval(self) -> float:
        return self.HEARTBEAT_INTERVAL if self.HEARTBEAT_INTERVAL is not None else self.ACK_TIMEOUT / 3

    def retention_of(self, queue: str | None = None) -> dict[str, float | None]:
        """How long ``queue``'s finished messages are kept, by status (None: every queue without
        its own ``retention``)."""
        declared = self.QUEUES.get(queue) if queue is not None else None
        own = declared.retention if declared is not None else None
        return {**self.RETENTION, **own} if own else dict(self.RETENTION)


def parse_settings(raw: Any) -> ZeroLossSettings:
    """Validate a raw ``ZEROLOSS`` value; raise :class:`SettingError` on the first bad entry."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise SettingError("*", f"ZEROLOSS must be a dict, got {type(raw).__name__}.", "zeroloss.E001")
    known = {f.name for f in dataclasses.fields(ZeroLossSettings)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise SettingError(
            unknown[0], f"unknown setting; known settings are {', '.join(sorted(known))}.", "zeroloss.E002"
        )
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in NUMBER_FIELDS:
            values[key] = parse_number(key, value, allow_zero=NUMBER_FIELDS[key][0])
        elif key in INT_FIELDS:
            values[key] = parse_integer(key, value, INT_FIELDS[key])
        elif key == "PARTITION_PERIOD":
            values[key] = parse_partition_period(key, value)
        elif key in (
            "HEARTBEAT_INTERVAL",
            "DB_OUTAGE_TOLERANCE",
            "HANDLER_TIMEOUT",
            "DEAD_PEER_TIMEOUT",
            "DEAD_LETTER_RETENTION",
        ):
            values[key] = None if value is None else parse_number(key, value, allow_zero=False)
        elif key == "QUEUE_DATABASES":
            if not isinstance(value, dict) or not all(
                isinstance(q, str) and q and isinstance(a, str) and a for q, a in value.items()
            ):
                raise SettingError(key, f"must be a dict of queue name -> database alias, got {value!r}.")
            values[key] = dict(value)
        elif key == "LEDGER_DATABASES":
            if (
                not isinstance(value, list | tuple)
                or not value
                or not all(isinstance(a, str) and a for a in value)
            ):
                raise SettingError(key, f"must be a non-empty list of database aliases, got {value!r}.")
            # An alias DATABASES does not define would fail only when the sweep reaches it.
            unknown_aliases = [a for a in value if a not in settings.DATABASES]
            if unknown_aliases:
                raise SettingError(
                    key, f"names {unknown_aliases!r}, not in DATABASES ({', '.join(settings.DATABASES)})."
                )
            values[key] = tuple(value)
        elif key == "SWEEP_QUEUE":
            if value is not None and (
                not isinstance(value, str) or not value.strip() or not is_printable(value) or len(value) > 255
            ):
                raise SettingError(
                    key,
                    f"must be a Celery queue name (printable, at most 255 characters) or None, got {value!r}.",
                )
            values[key] = value
        elif key == "PERSISTENCE_LEVEL":
            if value not in PERSISTENCE_LEVELS:
                raise SettingError(key, f"must be one of {PERSISTENCE_LEVELS}, got {value!r}.")
            values[key] = value
        elif key in ("PREPARED_STATEMENTS", "LISTEN", "TELEMETRY"):
            if not isinstance(value, bool):
                raise SettingError(key, f"must be True or False, got {value!r}.")
            values[key] = value
        elif key == "TRANSPORT":
            if value not in TRANSPORTS:
                raise SettingError(key, f"must be one of {TRANSPORTS}, got {value!r}.")
            values[key] = value
        elif key == "QUEUES":
            values[key] = _queues(value)
        elif key == "RETENTION":
            values[key] = {**DEFAULT_RETENTION, **parse_retention(key, value)}
        elif key == "JSON_ENCODER":
            if value is not None:
                parse_json_encoder(key, value)  # importable, and an encoder: E005 otherwise
            values[key] = value
        elif key == "SCHEDULES":
            values[key] = value  # each schedule's fields are checked by zeroloss.schedules
        elif key == "RETRY_BACKOFF":
            if not isinstance(value, dict) or set(value) - {"BASE", "MAX", "JITTER"}:
                raise SettingError(
                    key, f'must be a dict like {{"BASE": 1, "MAX": 300, "JITTER": True}}, got {value!r}.'
                )
            jitter = value.get("JITTER", RetryBackoff.JITTER)
            if not isinstance(jitter, bool):
                raise SettingError(f"{key}.JITTER", f"must be True or False, got {jitter!r}.")
            base = parse_number(f"{key}.BASE", value.get("BASE", RetryBackoff.BASE), allow_zero=True)
            cap = parse_number(f"{key}.MAX", value.get("MAX", RetryBackoff.MAX), allow_zero=True)
            if cap < base:
                raise SettingError(key, f"MAX ({cap}) must be >= BASE ({base}).")
            values[key] = RetryBackoff(BASE=base, MAX=cap, JITTER=jitter)
    if "RETENTION" not in values:
        # A project that set the older settings keeps what they said.
        values["RETENTION"] = {
            **DEFAULT_RETENTION,
            **(
                {Status.COMPLETED.value: values["COMPLETED_RETENTION"]}
                if "COMPLETED_RETENTION" in values
                else {}
            ),
            **(
                {Status.DEAD.value: values["DEAD_LETTER_RETENTION"]}
                if "DEAD_LETTER_RETENTION" in values
                else {}
            ),
        }
    return ZeroLossSettings(**values)


def _queues(value: Any) -> dict[str, QueueSettings]:
    """``QUEUES``: queue name -> dict of options (:data:`QUEUE_OPTIONS`); E006 otherwise."""
    from .exceptions import InvalidMessage

    if not isinstance(value, dict):
        raise SettingError(
            "QUEUES",
            f'must be a dict of queue name -> options, e.g. {{"emails": {{}}}}, got {value!r}.',
            "zeroloss.E006",
        )
    queues: dict[str, QueueSettings] = {}
    for name, options in value.items():
        try:
            _validation.validate_queue_name(name)
        except InvalidMessage as exc:
            raise SettingError("QUEUES", str(exc), "zeroloss.E006") from None
        where = f"QUEUES[{name!r}]"
        if not isinstance(options, dict):
            raise SettingError(
                where, f"must be a dict of options ({{}} for none), got {options!r}.", "zeroloss.E006"
            )
        unknown = sorted(set(options) - set(QUEUE_OPTIONS), key=str)
        if unknown:
            known = ", ".join(sorted(QUEUE_OPTIONS)) or "none yet"
            raise SettingError(
                where, f"unknown option {unknown[0]!r}; known options: {known}.", "zeroloss.E006"
            )
        queues[name] = QueueSettings(
            **{k: QUEUE_OPTIONS[k](f"{where}[{k!r}]", v) for k, v in options.items()}
        )
    return queues


_cached: ZeroLossSettings | None = None
#: ``JSON_ENCODER().default``, once looked up: (found, callable or None).
_json_default: tuple[bool, Any] = (False, None)


def json_default() -> Any:
    """The configured encoder's ``default`` method, or None (no ``JSON_ENCODER``)."""
    global _json_default
    found, default = _json_default
    if not found:
        path = get_settings().JSON_ENCODER
        default = None if path is None else parse_json_encoder("JSON_ENCODER", path)().default
        _json_default = (True, default)
    return default


_validation.json_default = json_default  # what canonical_json asks for a value JSON has no type for


def get_settings() -> ZeroLossSettings:
    """The validated settings; raises ImproperlyConfigured when ``ZEROLOSS`` is invalid."""
    global _cached
    if _cached is None:
        _cached = parse_settings(getattr(settings, "ZEROLOSS", None))
    return _cached


@receiver(setting_changed)
def _reset_cache(*, setting: str, **kwargs: Any) -> None:
    global _cached, _json_default
    if setting == "ZEROLOSS":
        _cached = None
        _json_default = (False, None)
