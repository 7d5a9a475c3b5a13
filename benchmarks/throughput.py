"""Batched, fenced throughput (issue 12) and ordered delivery (issue 16), each beside its limit.

Mixed into :class:`benchmarks.suite.Suite`. Workloads:

- ``batched``: zeroloss_worker drains with outcomes recorded one commit each (the 0.1
  behaviour, ``ACK_BATCH_SIZE=1``) and batched (the default), 1 and 4 processes, no-op and
  transactional (one INSERT) handlers, beside the raw batched claim + one-statement ack loop;
- ``bulksend``: ``send_many`` of 100,000 messages against ``persist_messages`` in batches of
  500 and a raw ``COPY`` of the same rows (message and audit rows);
- ``celery``: the peer row: the same no-op task on Celery with Redis (``acks_late``);
- ``peers``: the same no-op task on django-tasks-db, django-q2 and Procrastinate (each in its
  own processes and database; ``benchmarks/task_peers.py``);
- ``e2e``: send → handler start latency at half the measured drain rate;
- ``ordered``: drains of ordered messages over 100 and 10,000 keys against unordered, and claim
  latency with 10,000 messages waiting behind one blocked key against none.
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from . import db
from .db import MSG
from .report import Figure, Target

#: The backlog scenario's span of ``available_at`` and ``created_at`` (seconds).
BACKLOG_SPAN = 300.0


class ThroughputWorkloads:
    # Provided by Suite.
    conn: Any
    url: str
    runs: int
    sizes: Any
    workdir: Any

    def figure(self, key: str, label: str, unit: str, **kwargs: Any) -> Figure:
        raise NotImplementedError

    # -- batched drains ---------------------------------------------------------------

    def _drain(
        self, queue: str, procs: int, count: int, *, backlog: bool = False, **env: str
    ) -> tuple[float, dict[str, bool]]:
        """Workers started and ready, then ``count`` messages loaded (with fresh statistics); or,
        ``backlog``, the messages sent first (:meth:`_send_backlog`) and workers with default
        options started on them, as after a deploy, a restart or an outage."""
        from .suite import WorkerProcess, child_env

        db.reset(self.conn)
        self._effects_table()
        if backlog:
            self._send_backlog(queue, count)
        options = () if backlog else ("--poll-interval", "0.1")
        workers = [
            WorkerProcess(self.url, queue, self.workdir, *options, env=child_env(self.url, **env))
            for _ in range(procs)
        ]
        try:
            for w in workers:
                w.wait_ready()
            if not backlog:
                self.load_pending(queue, count)  # type: ignore[attr-defined]
            self.wait_drained(queue, count)  # type: ignore[attr-defined]
        finally:
            for w in workers:
                w.stop()
        window, checks = self.drain_window(queue)  # type: ignore[attr-defined]
        if queue == "bench.tx":
            row = self.conn.execute(
                "SELECT count(*), count(DISTINCT message_id) FROM bench_effects"
            ).fetchone()
            checks["effects exactly once"] = bool(row and row[0] == row[1] == count)
        return count / window, checks

    def _send_backlog(self, queue: str, count: int) -> None:
        """A backlog as users make one: ``send()`` in ordinary transactions of 1,000, no ANALYZE
        since; then spread over BACKLOG_SPAN seconds of ``available_at`` and ``created_at`` (oldest
        first), as a backlog sent over minutes is."""
        from django.db import transaction

        import zeroloss

        prefix = self.prefix(queue)  # type: ignore[attr-defined]
        for start in range(0, count, 1000):
            with transaction.atomic():
                for n in range(start, min(start + 1000, count)):
                    zeroloss.send(queue, {"n": n}, message_id=f"{prefix}-{n}")
        self.conn.execute(
            f"UPDATE {MSG} SET available_at = available_at - s, created_at = created_at - s FROM "
            f"(SELECT id AS sid, (max(id) OVER () - id) * %s * interval '1 second' AS s FROM {MSG} "
            "WHERE queue_name = %s) x WHERE id = sid",
            [BACKLOG_SPAN / max(count - 1, 1), queue],
        )

    def _raw_batched(self, procs: int, count: int, *, backlog: bool = False) -> float:
        from .suite import Child

        # A backlog is sent by send(), to a queue with a handler (the raw loop claims any).
        queue = "bench.noop" if backlog else f"bench.rawb{procs}"
        db.reset(self.conn)
        if backlog:
            self._send_backlog(queue, count)
        children = [
            Child("raw-batched", {"url": self.url, "queue": queue, "batch": 100}, self.url)
            for _ in range(procs)
        ]
        for c in children:
            c.ready()
        if not backlog:
            self.load_pending(queue, count)  # type: ignore[attr-defined]
        for c in children:
            c.go()
        for c in children:
            c.result()
        window, _ = self.drain_window(queue)  # type: ignore[attr-defined]
        return count / window

    def _effects_table(self) -> None:
        """The transactional handler's table, empty (created here: any workload may come first)."""
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_effects (id bigserial PRIMARY KEY, message_id text)"
        )
        self.conn.execute("TRUNCATE bench_effects")

    def run_batched(self) -> None:
        n = self.sizes.drain * 2
        self._effects_table()
        raw1 = self.figure(
            "raw.batched1", "raw SQL: claim 100 + one batched ack statement, 1 process", "msg/s"
        )
        raw4 = self.figure(
            "raw.batched4", "raw SQL: claim 100 + one batched ack statement, 4 processes", "msg/s"
        )
        per = {
            ("noop", 1): self.figure(
                "drain.percommit1", "zeroloss_worker, one commit per outcome (0.1), 1 process, no-op", "msg/s"
            ),
            ("tx", 1): self.figure(
                "drain.percommit1.tx",
                "zeroloss_worker, one commit per outcome (0.1), 1 process, 1 INSERT",
                "msg/s",
            ),
        }
        batched = {
            ("noop", 1): self.figure(
                "drain.batched1",
                "zeroloss_worker, batched outcomes, 1 process, no-op handler",
                "msg/s",
                ratio_to="drain.percommit1",
                target=Target(">= 8x one commit per outcome, >= 0.6x raw batched", "ratio", 8.0),
            ),
            ("noop", 4): self.figure(
                "drain.batched4",
                "zeroloss_worker, batched outcomes, 4 processes, no-op handler",
                "msg/s",
                ratio_to="drain.batched1",
                target=Target(">= 1.4x one process", "ratio", 1.4),
            ),
            ("tx", 1): self.figure(
                "drain.batched1.tx",
                "zeroloss_worker, batched, 1 process, transactional 1 INSERT",
                "msg/s",
                ratio_to="drain.percommit1.tx",
                target=Target(">= 5x one commit per outcome, effects exactly once", "ratio", 5.0),
            ),
            ("tx", 4): self.figure(
                "drain.batched4.tx", "zeroloss_worker, batched, 4 processes, transactional 1 INSERT", "msg/s"
            ),
        }
        # Workers started on a backlog sent before them (_send_backlog), beside the raw loop on the same.
        raw_backlog = {
            procs: self.figure(
                f"raw.backlog{procs}",
                f"raw SQL: claim 100 + one batched ack statement, {procs} process(es), on a backlog sent first",
                "msg/s",
            )
            for procs in (1, 4)
        }
        backlog = {
            procs: self.figure(
                f"drain.backlog{procs}",
                f"zeroloss_worker (default options), {procs} process(es), started on a backlog sent first",
                "msg/s",
                ratio_to=f"raw.backlog{procs}",
                target=Target(">= 0.6x raw batched on the same backlog", "ratio", 0.6),
            )
            for procs in (1, 4)
        }
        checks: dict[str, bool] = {}
        for run in range(self.runs):
            for procs in (1, 4):
                raw_backlog[procs].values.append(self._raw_batched(procs, n, backlog=True))
                rate, ok = self._drain("bench.noop", procs, n, backlog=True)
                backlog[procs].values.append(rate)
                checks[backlog[procs].key] = checks.get(backlog[procs].key, True) and all(ok.values())
            _log(
                f"backlog run {run + 1}: raw {raw_backlog[1].values[-1]:,.0f}/{raw_backlog[4].values[-1]:,.0f}, "
                f"zeroloss_worker {backlog[1].values[-1]:,.0f} / 4 proc {backlog[4].values[-1]:,.0f} msg/s"
            )
            raw1.values.append(self._raw_batched(1, n))
            raw4.values.append(self._raw_batched(4, n))
            for (kind, procs), fig in per.items():
                rate, ok = self._drain(
                    "bench.noop" if kind == "noop" else "bench.tx",
                    procs,
                    max(n // 10, 500),
                    ZEROLOSS_BENCH_ACK_BATCH_SIZE="1",
                )
                fig.values.append(rate)
                checks[fig.key] = checks.get(fig.key, True) and all(ok.values())
            for (kind, procs), fig in batched.items():
                rate, ok = self._drain("bench.noop" if kind == "noop" else "bench.tx", procs, n)
                fig.values.append(rate)
                checks[fig.key] = checks.get(fig.key, True) and all(ok.values())
            _log(
                f"batched run {run + 1}: raw {raw1.values[-1]:,.0f}/{raw4.values[-1]:,.0f}, per-commit "
                f"{per[('noop', 1)].values[-1]:,.0f} (tx {per[('tx', 1)].values[-1]:,.0f}), batched "
                f"{batched[('noop', 1)].values[-1]:,.0f} / 4 proc {batched[('noop', 4)].values[-1]:,.0f} "
                f"(tx {batched[('tx', 1)].values[-1]:,.0f} / {batched[('tx', 4)].values[-1]:,.0f}) msg/s"
            )
        for fig in [*per.values(), *batched.values(), *backlog.values()]:
            fig.checks["exactly once"] = checks.get(fig.key, False)
        raw_median = statistics.median(raw1.values)
        batched[("noop", 1)].info["ratio_to_raw_batched"] = (
            statistics.median(batched[("noop", 1)].values) / raw_median
        )
        db.reset(self.conn)

    # -- bulk send --------------------------------------------------------------------

    def run_bulksend(self) -> None:
        from zeroloss.runtime.transports import send_many

        from .raw import copy_messages

        n = self.sizes.bulk * 2
        copy = self.figure("raw.copy", f"raw SQL: COPY {n:,} message rows + their audit rows", "msg/s")
        old = self.figure("persist.bulk500", f"persist_messages in batches of 500, {n:,} messages", "msg/s")
        many = self.figure(
            "send_many",
            f"send_many of {n:,} messages, one call",
            "msg/s",
            ratio_to="persist.bulk500",
            target=Target(">= 2x persist_messages batches, >= 0.5x raw COPY", "ratio", 2.0),
        )
        service = self.service()  # type: ignore[attr-defined]
        for run in range(self.runs):
            db.reset(self.conn)
            copy.values.append(n / copy_messages(self.url, queue="bench.copy", prefix=f"c{run}", count=n))
            db.reset(self.conn)
            started = time.perf_counter()
            for start in range(0, n, 500):
                service.persist_messages(
                    [(f"o{run}-{i}", "bench.noop", {"n": i}) for i in range(start, min(start + 500, n))]
                )
            old.values.append(n / (time.perf_counter() - started))
            db.reset(self.conn)
            started = time.perf_counter()
            send_many(
                "bench.noop", ({"n": i} for i in range(n)), message_ids=(f"m{run}-{i}" for i in range(n))
            )
            many.values.append(n / (time.perf_counter() - started))
            _log(
                f"bulk send run {run + 1}: COPY {copy.values[-1]:,.0f}, persist_messages {old.values[-1]:,.0f}, "
                f"send_many {many.values[-1]:,.0f} msg/s"
            )
        row = self.conn.execute(f"SELECT count(*) FROM {MSG} WHERE queue_name = 'bench.noop'").fetchone()
        many.checks["all stored"] = bool(row and row[0] == n)
        many.info["ratio_to_copy"] = statistics.median(many.values) / statistics.median(copy.values)
        db.reset(self.conn)

    # -- the Celery + Redis peer --------------------------------------------------------

    def run_celery(self) -> None:
        from .suite import ROOT

        n = self.sizes.drain
        fig = self.figure("peer.celery", "Celery + Redis, no-op task, acks_late, 1 worker process", "msg/s")
        zl = self.figure(
            "drain.batched1.vs_celery",
            "zeroloss_worker, batched, 1 process, no-op (beside the Celery row)",
            "msg/s",
            ratio_to="peer.celery",
            target=Target(">= 3x Celery + Redis, while durable", "ratio", 3.0),
        )
        broker = os.environ.get("ZEROLOSS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
        for run in range(self.runs):
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.celery_peer", broker, str(n)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
            ).stdout
            fig.values.append(float(out.strip().splitlines()[-1]))
            rate, _ = self._drain("bench.noop", 1, n)
            zl.values.append(rate)
            _log(
                f"celery run {run + 1}: Celery + Redis {fig.values[-1]:,.0f}, zeroloss {zl.values[-1]:,.0f} msg/s"
            )
        fig.info["broker"] = broker

    # -- the Django task-queue peers: django-tasks-db and django-q2 ----------------------

    def run_peers(self) -> None:
        """Each peer drains the same no-op tasks in its own processes (``benchmarks/task_peers.py``,
        its own database on this server), with zeroloss's one-process drain beside it in each run."""
        from .suite import ROOT

        n = min(self.sizes.drain, 2_000)  # the peers commit per task: minutes for 20,000
        labels = {
            "tasks-db": "django-tasks-db, no-op task, 1 db_worker process",
            "django-q2": "django-q2 (ORM broker), no-op task, 1 worker process",
            "procrastinate": "Procrastinate, no-op task, 1 worker, concurrency 1",
        }
        server = self.url
        for peer, label in labels.items():
            key = f"peer.{peer.replace('-', '_')}"
            fig = self.figure(key, label, "msg/s")
            zl = self.figure(
                f"drain.batched1.vs_{peer.replace('-', '_')}",
                f"zeroloss_worker, batched, 1 process, no-op (beside the {peer} row)",
                "msg/s",
                ratio_to=key,
            )
            for run in range(self.runs):
                done = subprocess.run(
                    [sys.executable, "-m", "benchmarks.task_peers", peer, server, str(n)],
                    cwd=ROOT,
                    capture_output=True,
                    text=True,
                    timeout=900,
                    check=False,
                )
                if done.returncode != 0:
                    raise RuntimeError(f"the {peer} peer failed:\n{done.stderr[-4000:]}")
                fig.values.append(float(done.stdout.strip().splitlines()[-1]))
                rate, _ = self._drain("bench.noop", 1, n)
                zl.values.append(rate)
                _log(
                    f"{peer} run {run + 1}: {peer} {fig.values[-1]:,.0f}, zeroloss {zl.values[-1]:,.0f} msg/s"
                )
            fig.info["tasks"] = n
        self._run_pgqueuer()

    def _run_pgqueuer(self) -> None:
        """PgQueuer 1.6 (``benchmarks/pgqueuer_peer.py``, batch 25) against one zeroloss_worker
        with default options started on a backlog sent first, in each run."""
        from urllib.parse import urlparse

        from .pgqueuer_peer import DEFAULT_BATCH
        from .pgqueuer_peer import run as pgqueuer_run

        n = self.sizes.drain
        fig = self.figure(
            "peer.pgqueuer",
            f"PgQueuer 1.6 (asyncpg), no-op job, 1 worker process, batch {DEFAULT_BATCH}, no concurrency "
            "limit; deletes each finished job, no audit row, no fence",
            "msg/s",
        )
        zl = self.figure(
            "drain.backlog1.vs_pgqueuer",
            "zeroloss_worker (default options), 1 process, no-op, on a backlog sent first (beside PgQueuer)",
            "msg/s",
            ratio_to="peer.pgqueuer",
            target=Target(">= 1x PgQueuer, every outcome fenced and audited", "ratio", 1.0),
        )
        prefix = urlparse(self.url).path.lstrip("/") or "zeroloss_benchpeer"
        for run in range(self.runs):
            fig.values.append(pgqueuer_run(self.url, n, DEFAULT_BATCH, prefix))
            rate, _ = self._drain("bench.noop", 1, n, backlog=True)
            zl.values.append(rate)
            _log(
                f"pgqueuer run {run + 1}: PgQueuer {fig.values[-1]:,.0f}, zeroloss {zl.values[-1]:,.0f} msg/s"
            )
        fig.info["jobs"] = n

    # -- end-to-end latency at half load ----------------------------------------------

    def run_e2e(self) -> None:
        from .suite import WorkerProcess

        p50 = self.figure(
            "e2e.p50", "send → handler start, p50, at half the drain rate", "ms", higher_is_better=False
        )
        p99 = self.figure(
            "e2e.p99",
            "send → handler start, p99, at half the drain rate",
            "ms",
            higher_is_better=False,
            target=Target("<= 50 ms", "max", 50.0),
        )
        rate, _ = self._drain("bench.noop", 1, self.sizes.drain)
        target = rate / 2
        seconds = 3.0 if self.sizes.drain < 10_000 else 8.0
        for run in range(self.runs):
            db.reset(self.conn)
            worker = WorkerProcess(self.url, "bench.latency", self.workdir, "--poll-interval", "0.5")
            try:
                worker.wait_ready()
                time.sleep(0.5)
                sent, achieved = _produce("bench.latency", target, seconds)
                p99.info.setdefault("achieved_rates", []).append(achieved)
                self.wait_drained("bench.latency", sent)  # type: ignore[attr-defined]
            finally:
                worker.stop()
            rows = self.conn.execute(
                f"SELECT (result::text)::float8 - (payload->>'sent')::float8 FROM {MSG} WHERE queue_name = 'bench.latency'"
            ).fetchall()
            latencies = sorted(r[0] * 1000 for r in rows)
            p50.values.append(latencies[len(latencies) // 2])
            p99.values.append(latencies[min(int(len(latencies) * 0.99), len(latencies) - 1)])
            _log(
                f"e2e run {run + 1}: {sent} sent at {target:,.0f}/s (achieved {achieved:,.0f}/s), p50 {p50.values[-1]:.1f} ms, p99 {p99.values[-1]:.1f} ms"
            )
        p99.info["send_rate"] = target
        db.reset(self.conn)

    # -- ordered delivery -------------------------------------------------------------

    def run_ordered(self) -> None:
        from zeroloss.ledger.service import ZeroLossMessageService

        n = self.sizes.drain
        unordered = self.figure("ordered.none", "drain, unordered, 1 process", "msg/s")
        figs = {
            keys: self.figure(
                f"ordered.{keys}",
                f"drain, ordered over {keys:,} keys, 1 process",
                "msg/s",
                ratio_to="ordered.none",
            )
            for keys in (100, 10_000)
        }
        free = self.figure("claim.unblocked", "claim_next(10), nothing blocked", "ms", higher_is_better=False)
        blocked = self.figure(
            "claim.blocked",
            "claim_next(10) with 10,000 messages waiting behind one blocked key",
            "ms",
            higher_is_better=False,
            ratio_to="claim.unblocked",
            target=Target("within 2x of unblocked", "ratio_max", 2.0),
        )
        service = ZeroLossMessageService(instance_id="bench-ordered")
        for run in range(self.runs):
            unordered.values.append(self._drain("bench.noop", 1, n)[0])
            for keys, fig in figs.items():
                db.reset(self.conn)
                self._effects_table()
                fig.values.append(self._drain_ordered(n, keys))
            for with_blocked, fig in ((False, free), (True, blocked)):
                db.reset(self.conn)
                if with_blocked:
                    service.persist_messages(
                        [(f"w{i}", "bench.claim", {}) for i in range(10_000)], ordering_key="stuck"
                    )
                    service.claim("bench.claim")  # the key's head is in hand
                self.load_pending("bench.claim", 2_000)  # type: ignore[attr-defined]
                timings = []
                while True:
                    t0 = time.perf_counter()
                    leases = service.claim("bench.claim", limit=10)
                    timings.append((time.perf_counter() - t0) * 1000)
                    if not leases or len(timings) > 150:
                        break
                fig.values.append(statistics.median(timings))
            _log(
                f"ordered run {run + 1}: unordered {unordered.values[-1]:,.0f}, 100 keys {figs[100].values[-1]:,.0f}, "
                f"10k keys {figs[10_000].values[-1]:,.0f} msg/s; claim {free.values[-1]:.2f} vs blocked {blocked.values[-1]:.2f} ms"
            )
        db.reset(self.conn)

    def _drain_ordered(self, n: int, keys: int) -> float:
        from zeroloss.ledger.service import ZeroLossMessageService

        from .suite import WorkerProcess

        service = ZeroLossMessageService(instance_id="bench-ordered")
        for start in range(0, n, 5000):
            batch = range(start, min(start + 5000, n))
            for k in range(keys):
                chunk = [(f"o{i}", "bench.noop", {"n": i}) for i in batch if i % keys == k]
                if chunk:
                    service.persist_messages(chunk, ordering_key=f"key-{k}")
        # Statistics as autovacuum keeps them on a live table: right after a bulk load into an
        # emptied table the planner still thinks it tiny, and the promotion's anti-join picks a
        # plan that was measured up to 30x slower until autovacuum's next analyze.
        self.conn.execute("ANALYZE zeroloss_message")
        worker = WorkerProcess(self.url, "bench.noop", self.workdir, "--poll-interval", "0.1")
        try:
            worker.wait_ready()
            self.wait_drained("bench.noop", n)  # type: ignore[attr-defined]
        finally:
            worker.stop()
        window, _ = self.drain_window("bench.noop")  # type: ignore[attr-defined]
        return n / window


#: Transactions per second one producer process sustains with room to spare on this host
#: (a lone persist_message commits about 2,500 times a second here, at a full core).
PRODUCER_TX_RATE = 1000


def _produce(queue: str, rate: float, seconds: float) -> tuple[int, float]:
    """Send at ``rate`` messages per second for ``seconds``, each carrying its send time.

    Above ``PRODUCER_TX_RATE`` the messages go in transactions of a few (``persist_messages``),
    spread evenly: one process sending one message per commit cannot reach the drain's half
    rate, and a producer behind its schedule would saturate a core and measure the host's
    scheduler instead of the ledger. Returns the count sent and the rate achieved.
    """
    from zeroloss.ledger.service import ZeroLossMessageService

    service = ZeroLossMessageService(instance_id="bench-producer")
    per_tx = max(1, math.ceil(rate / PRODUCER_TX_RATE))
    count = int(rate * seconds) // per_tx * per_tx
    started = time.perf_counter()
    for first in range(0, count, per_tx):
        due = started + first / rate
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        now = time.time()
        if per_tx == 1:
            service.persist_message(f"lat-{first}", queue, {"sent": now})
        else:
            service.persist_messages(
                [(f"lat-{i}", queue, {"sent": now}) for i in range(first, first + per_tx)]
            )
    return count, count / (time.perf_counter() - started)


def _log(message: str) -> None:
    print(f"  . {message}", file=sys.stderr, flush=True)


__all__ = ["ThroughputWorkloads", "threading"]
