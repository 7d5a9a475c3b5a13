"""Django task-queue peers: ``python -m benchmarks.task_peers PEER SERVER_URL COUNT`` prints msg/s.

``PEER`` is ``tasks-db`` (django-tasks-db: Django's Tasks API with its database backend and
``db_worker``), ``django-q2`` (its ORM broker and ``qcluster`` with one worker) or
``procrastinate`` (a plain Procrastinate app, ``benchmarks/procrastinate_peer.py``, and its
worker with concurrency 1). Each runs in this process and its worker's, with only itself
installed (``benchmarks/peer_settings.py``; Procrastinate without Django), on
its own database on the same PostgreSQL server (created, migrated and dropped here). COUNT
no-op tasks are enqueued first (not timed), then one worker process drains them; the rate is
COUNT / (last task end - first task start) as the peer's own result rows record them, the way
the Celery peer and zeroloss's drains are timed.

Needs the ``bench`` dependency group (``pip install --group bench``; ``make bench`` installs it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import psycopg

ROOT = Path(__file__).resolve().parent.parent
PEERS = ("tasks-db", "django-q2", "procrastinate")


def _database_url(server_url: str, name: str) -> str:
    return urlunparse(urlparse(server_url)._replace(path=f"/{name}"))


def _setup() -> None:
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _enqueue(peer: str, count: int) -> None:
    if peer == "procrastinate":
        from benchmarks.procrastinate_peer import app
        from benchmarks.procrastinate_peer import noop as procrastinate_noop

        with app.open():
            app.schema_manager.apply_schema()
            procrastinate_noop.batch_defer(*({} for _ in range(count)))
        return
    from django.db import transaction

    if peer == "tasks-db":
        from benchmarks.peer_tasks import noop

        with transaction.atomic():
            for _ in range(count):
                noop.enqueue()
    else:
        from django_q.tasks import async_task

        for _ in range(count):
            async_task("benchmarks.peer_tasks.noop_q")


def _worker(peer: str) -> list[str]:
    manage = [sys.executable, "-m", "django"]
    if peer == "procrastinate":
        # --one-shot: drain what is there, then exit.
        app = "benchmarks.procrastinate_peer.app"
        return [
            sys.executable,
            "-m",
            "procrastinate",
            f"--app={app}",
            "worker",
            "--concurrency",
            "1",
            "--one-shot",
        ]
    if peer == "tasks-db":
        # --batch: drain what is there, then exit.
        return [
            *manage,
            "db_worker",
            "--batch",
            "--interval",
            "0.1",
            "--no-startup-delay",
            "--no-reload",
            "-v",
            "0",
        ]
    return [*manage, "qcluster"]


def _done_and_window(peer: str) -> tuple[int, float]:
    if peer == "procrastinate":
        with psycopg.connect(os.environ["BENCHPEER_DATABASE_URL"]) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE type = 'succeeded'),"
                " extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')"
                " - min(at) FILTER (WHERE type = 'started'))"
                " FROM procrastinate_events"
            ).fetchone()
        assert row is not None
        return int(row[0]), float(row[1] or 0.0)
    from django.db.models import Max, Min

    if peer == "tasks-db":
        from django_tasks_db.models import DBTaskResult

        rows = DBTaskResult.objects.filter(finished_at__isnull=False)
        span = rows.aggregate(first=Min("started_at"), last=Max("finished_at"))
    else:
        from django_q.models import Success

        rows = Success.objects.all()
        span = rows.aggregate(first=Min("started"), last=Max("stopped"))
    done = rows.count()
    window = (span["last"] - span["first"]).total_seconds() if done else 0.0
    return done, window


def main() -> int:
    peer, server_url, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if peer not in PEERS:
        raise SystemExit(f"PEER must be one of {', '.join(PEERS)}")
    name = f"zeroloss_benchpeer_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "benchmarks.peer_settings",
        "BENCHPEER": peer,
        "BENCHPEER_DATABASE_URL": _database_url(server_url, name),
    }
    os.environ.update(env)
    worker = None
    log = None
    try:
        if peer != "procrastinate":
            _setup()
        _enqueue(peer, count)
        # The worker's log goes to a file: a pipe nobody reads fills up and blocks the worker.
        log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in the finally block)
        worker = subprocess.Popen(_worker(peer), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while True:
            done, window = _done_and_window(peer)
            if done >= count:
                break
            if time.monotonic() > deadline or (worker.poll() is not None and worker.returncode != 0):
                log.seek(0)
                raise SystemExit(
                    f"{peer} peer drained {done}/{count}; its worker's log ends:\n{log.read()[-4000:]}"
                )
            time.sleep(0.1)
    finally:
        if worker is not None and worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=30)
        if log is not None:
            log.close()
        if peer != "procrastinate":
            from django.db import connections

            connections.close_all()
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(f"{count / max(window, 1e-9):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
