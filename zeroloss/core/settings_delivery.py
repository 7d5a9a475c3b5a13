"""The settings of delivering a message (leases and retries, outcomes and outages, the sweep and
the transport: the first tables of ``docs/settings.md``), with the kinds of value only they take."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from .queue_settings import CELERY_QUEUE_NAME, LEDGER_DATABASES, QUEUE_DATABASES, QUEUES, QueueSettings
from .setting_values import Kind, SettingError, choice, integer, parse_number, seconds, setting


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


def _backoff(key: str, value: Any, check_id: str) -> RetryBackoff:
    if not isinstance(value, dict) or set(value) - {"BASE", "MAX", "JITTER"}:
        raise SettingError(
            key, f'must be a dict like {{"BASE": 1, "MAX": 300, "JITTER": True}}, got {value!r}.', check_id
        )
    jitter = value.get("JITTER", RetryBackoff.JITTER)
    if not isinstance(jitter, bool):
        raise SettingError(f"{key}.JITTER", f"must be True or False, got {jitter!r}.", check_id)
    base = parse_number(
        f"{key}.BASE", value.get("BASE", RetryBackoff.BASE), allow_zero=True, check_id=check_id
    )
    cap = parse_number(f"{key}.MAX", value.get("MAX", RetryBackoff.MAX), allow_zero=True, check_id=check_id)
    if cap < base:
        raise SettingError(key, f"MAX ({cap}) must be >= BASE ({base}).", check_id)
    return RetryBackoff(BASE=base, MAX=cap, JITTER=jitter)


BACKOFF = Kind(
    _backoff,
    "dict with `BASE`, `MAX` ≥ 0 (any key may be omitted), `MAX ≥ BASE`, `JITTER` `True`/`False`",
    "s",
)


@dataclass(frozen=True)
class LeaseSettings:
    """Leases and retries."""

    ACK_TIMEOUT: float = setting(
        5.0,
        seconds(),
        """Length of a lease. A worker that neither acknowledges nor renews within it loses the
        message to the sweep. Also the lower bound of crash recovery time ([sweep.md](sweep.md)).""",
    )
    HEARTBEAT_INTERVAL: float | None = setting(
        None,
        seconds(none=True),
        """How often a worker renews the leases it holds while handlers run (one `UPDATE` per
        worker thread per interval). Must be well below `ACK_TIMEOUT` (`zeroloss.W002`).""",
        shown="`None` = `ACK_TIMEOUT / 3`",
    )
    MAX_ATTEMPTS: int = setting(
        5,
        integer(1, 1_000_000),
        """Claims before a message is dead-lettered. Handler failures **and** expired leases
        count. Per handler: `@zeroloss.handler(..., max_attempts=N)`; per message: `send(...,
        max_attempts=N)` / `persist_message(..., max_attempts=N)` ([retry
        policy](handlers.md#retry-policy)).""",
        unit="claims",
    )
    MAX_SNOOZES: int = setting(
        100,
        integer(0, 1_000_000),
        """How many times one message's handler may raise `zeroloss.Snooze` without counting an
        attempt. Past it each snooze counts as a failed attempt (retried after the snooze's delay,
        dead-lettered when the attempts are spent), so a message cannot snooze for ever. `0`:
        every snooze counts ([retry policy](handlers.md#retry-policy)).""",
        unit="snoozes",
    )
    HANDLER_TIMEOUT: float | None = setting(
        None,
        seconds(none=True),
        """A handler still running after this long stops having its lease renewed: the message
        goes to another worker once its lease expires, and this run's outcome is refused (the
        thread itself cannot be killed; it finishes when the handler returns). For a
        **transactional** handler the lease keeper also ends the batch's database session, so its
        transaction and locks go at once and the other messages it had run go back unstarted; the
        server bounds each idle gap and statement of the batch's transaction by `HANDLER_TIMEOUT +
        ACK_TIMEOUT`. `None`: a live worker renews for as long as its handler runs. An `async def`
        handler is cancelled at this point instead, a failed attempt (`HandlerTimedOut`;
        [async.md](async.md)). A handler's own `time_limit` (`@zeroloss.handler(...,
        time_limit=S)`) overrides it for that handler, and `zeroloss_worker --pool process` kills
        the child running a handler past it
        ([control.md](control.md#time-limits-and-the-process-pool)).""",
    )
    DEAD_PEER_TIMEOUT: float | None = setting(
        10.0,
        seconds(none=True),
        """How long a worker process's database session may go unanswered before each end gives it
        up: every session sets server-side `tcp_keepalives_*` and `tcp_user_timeout`, and a
        PostgreSQL database whose `OPTIONS` name no keepalive gets libpq's. A cut-off or dead
        worker's transaction, and every lock in it, ends within this bound
        ([guarantees](guarantees.md#every-lock-bounded-by-its-lease)). `None`: the system's TCP
        defaults (hours).""",
    )
    ASYNC_CONCURRENCY: int = setting(
        10,
        integer(1),
        """How many `async def` handlers of one claimed batch one worker thread awaits at once
        (its event loop's window: one finishes, the next starts). The claim size follows the
        handlers' overlapped pace. 1: one at a time. Plain (`def`) handlers always run one at a
        time per thread ([async.md](async.md)).""",
        unit="handlers",
    )
    RETRY_BACKOFF: RetryBackoff = setting(
        RetryBackoff(),
        BACKOFF,
        """After a handler failure, the message is claimable again after a delay drawn uniformly
        from 0 to `min(BASE * 2 ** (attempt - 1), MAX)` seconds (*full jitter*: bounds 1, 2, 4,
        8... capped at 5 minutes), so the messages one incident failed together do not all retry
        together and fail together again. `"JITTER": False`: exactly the bound, as before 0.3. A
        lease expiry requeues at once, without backoff. A handler's `backoff=` overrides it for
        that handler, and `zeroloss.Retry(delay=…)` for one attempt ([retry
        policy](handlers.md#retry-policy)).""",
        shown='`{"BASE": 1.0, "MAX": 300.0, "JITTER": True}`',
    )


@dataclass(frozen=True)
class OutcomeSettings:
    """Outcomes and outages."""

    ACK_BATCH_SIZE: int = setting(
        100,
        integer(1),
        """Outcomes (acknowledge, fail, release) recorded together, in one fenced statement per
        kind. A worker records its batch at the latest when it is done with its claim.""",
        unit="outcomes",
    )
    ACK_FLUSH_INTERVAL: float = setting(
        0.05,
        seconds(zero=True),
        """The longest an outcome waits for its batch. A process killed with outcomes waiting
        loses only those: their messages run again after the sweep
        ([guarantees.md](guarantees.md)).""",
    )
    DB_OUTAGE_TOLERANCE: float | None = setting(
        None,
        seconds(none=True),
        """How long workers, `zeroloss_sweep --loop` and the lease keeper ride out an unreachable
        database before the process exits (code 4). `None`: never give up; reconnect with backoff
        for as long as it takes.""",
    )


@dataclass(frozen=True)
class SweepSettings:
    """The sweep and the transport."""

    SWEEP_INTERVAL: float = setting(
        2.0,
        seconds(),
        """How often the recovery sweep runs: in each `zeroloss_worker` process, in
        `zeroloss_sweep --loop` (unless `--interval`), and as the Celery beat entry
        (`beat_schedule_entry()`). Longer than `ACK_TIMEOUT` warns `zeroloss.W001`.""",
    )
    SWEEP_BATCH_SIZE: int = setting(
        1000,
        integer(1),
        """Messages one sweep transaction moves at most; a sweep runs batches until one comes back
        short. `zeroloss_sweep --batch-size` overrides it.""",
        unit="messages",
    )
    TRANSPORT: str = setting(
        "database",
        choice("database", "celery"),
        """`"database"`: nothing is published; `zeroloss_worker` polls the ledger. `"celery"`:
        `send` publishes a Celery task after commit, and the beat sweep publishes again what the
        broker lost ([celery.md](celery.md)).""",
    )
    SWEEP_QUEUE: str | None = setting(
        "zeroloss.sweep",
        CELERY_QUEUE_NAME,
        """The Celery queue beat sends the sweep task to, so deliveries cannot delay it. A worker
        must consume it (`--queues celery,zeroloss.sweep`). `None`: Celery's default queue.""",
    )
    PUBLISH_TIMEOUT: float = setting(
        2.0,
        seconds(),
        """Celery transport: the longest any one wait on the broker may take while publishing
        (connecting, each send). The first publish that fails or times out ends the batch: the
        rest are recorded as undispatched, without trying each, and the next sweep publishes them.""",
    )
    QUEUES: dict[str, QueueSettings] = setting(
        {},
        QUEUES,
        """Queues **declared** without their handler having to be imported: `send`, `send_many`
        and `asend` accept them in a process that has no handler for them (the web side of a
        web/worker split, whose image does not import the workers' code); without a declaration
        such a send raises `UnknownQueue`, which catches typos. `zeroloss_worker` refuses to run a
        declared queue it has no handler for: exit code 2 and the queues named (with no `--queue`,
        a worker serves every registered queue and every declared one). Options per queue:
        `concurrency` (an integer from 1: at most that many of the queue's messages processing at
        once, across every worker) and `rate` (`"N/s"`, `"N/m"`, `"N/h"`: at most N claims started
        per period, across every worker), both enforced where messages are claimed and overridable
        at run time by `zeroloss_queue limit` ([control.md](control.md#limits)); a bad limit is
        `zeroloss.E007`. An unknown option, a bad queue name or a value that is not a dict is
        `zeroloss.E006` ([production.md](production.md#a-webworker-split)).""",
        check_id="zeroloss.E006",
    )
    QUEUE_DATABASES: dict[str, str] = setting(
        {},
        QUEUE_DATABASES,
        """Queues whose ledger lives in another database (several ledgers, for deployments that
        outgrow one primary): `send` stores each queue's messages there (and refuses a send inside
        a transaction on another database, which it would otherwise commit outside that
        transaction); run workers and sweeps per database: `zeroloss_worker --queue Q` claims from
        Q's database, one process from one database (queues of two databases in one worker, or a
        `--database` that is not the queue's, are refused with exit code 2; without `--queue`,
        `--database ALIAS` takes the registered queues routed there). Every other queue's ledger
        is `default`.""",
    )
    LEDGER_DATABASES: tuple[str, ...] = setting(
        ("default",),
        LEDGER_DATABASES,
        """The databases that hold a ledger, besides those `QUEUE_DATABASES` routes to. The Celery
        beat sweep covers each; under Celery, `send(..., using=...)` refuses any other alias.""",
        shown='`("default",)`',
    )
    REDISPATCH_AFTER: float = setting(
        30.0,
        seconds(),
        """Celery transport: a pending, available message published this long ago and still
        unclaimed is published again by the beat sweep. Unused with `"database"`.""",
    )
