"""The zero-loss demo: ``make demo`` (or ``python -m project.demo.run``).

On the embedded default (SQLite file, built-in database worker, no broker) it:

1. migrates and creates an admin user, printing its credentials;
2. sends a few thousand messages to two queues inside transactions;
3. runs several worker processes, SIGKILLs one of them while it holds leases, and lets the
   recovery sweep give its messages back;
4. prints a live progress view, then a summary computed from the ledger and from the
   handlers' own records (``HandledRecord``): sent, completed, recovered by the sweep,
   dead-lettered, lost, handled twice;
5. serves the admin and the dashboard at http://127.0.0.1:8000/admin/ until Ctrl-C
   (``--no-serve`` skips this).

With ``DATABASE_URL=postgres://...`` and ``CELERY_BROKER_URL=redis://...`` the same demo runs
on PostgreSQL with Celery workers and beat.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VAR = Path(os.environ.get("ZEROLOSS_VAR_DIR", ROOT / "var"))
ORDERS = "demo.orders"
EMAILS = "demo.emails"
TASKS = "demo.tasks"  # the Django task of project/demo/tasks.py (TASKS in project/settings.py)


def celery_command(*args: str) -> list[str]:
    """``celery -A project ARGS`` with this interpreter."""
    return [sys.executable, "-m", "celery", "-A", "project", *args]


def celery_beat_command(*, loglevel: str, schedule: Path) -> list[str]:
    """``celery beat``, its schedule state in ``schedule``."""
    return celery_command("beat", "--loglevel", loglevel, "--schedule", str(schedule))


def celery_worker_command(
    *, concurrency: int, loglevel: str, hostname: str, heartbeat: bool = True
) -> list[str]:
    """``celery worker`` for the ledger's transport: the app's queues and the sweep's, prefork,
    one message prefetched (a worker that dies holds no more than the one it runs)."""
    return [
        *celery_command("worker"),
        "--queues",
        "celery,zeroloss.sweep",
        "--pool",
        "prefork",
        "--concurrency",
        str(concurrency),
        "--loglevel",
        loglevel,
        "--hostname",
        hostname,
        "--without-gossip",
        "--without-mingle",
        *([] if heartbeat else ["--without-heartbeat"]),
        "--prefetch-multiplier",
        "1",
    ]


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=3000, help="Messages to send (default 3000).")
    parser.add_argument("--workers", type=int, default=3, help="Worker processes (default 3).")
    parser.add_argument(
        "--fail-every", type=int, default=50, help="Every Nth email always fails (dead letter)."
    )
    parser.add_argument(
        "--no-serve", action="store_true", help="Exit after the summary instead of serving the admin."
    )
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--json", metavar="FILE", help="Also write the summary as JSON to FILE.")
    parser.add_argument("--timeout", type=float, default=300, help="Give up waiting after this many seconds.")
    args = parser.parse_args()
    if args.messages < 10 or args.workers < 2 or args.fail_every < 2:
        parser.error("--messages must be >= 10, --workers >= 2 and --fail-every >= 2")
    return args


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    env.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    # Short retry backoff so the dead-letter path shows within the demo's run time.
    env.setdefault("ZEROLOSS_RETRY_BACKOFF_BASE", "0.2")
    return env


def _die_with_parent() -> None:
    """Linux: a worker gets SIGTERM if the demo itself dies (even by SIGKILL), so none is orphaned."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class Workers:
    """The worker processes: ``zeroloss_worker`` on the embedded default, Celery with a broker."""

    def __init__(self, count: int, celery: bool) -> None:
        self.celery = celery
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed: list[int] = []
        self.log = open(VAR / "demo-workers.log", "ab")  # noqa: SIM115
        for n in range(count):
            self.procs.append(self._start(n))
        self.workers = list(self.procs)
        if celery:
            self.procs.append(
                self._spawn(celery_beat_command(loglevel="WARNING", schedule=VAR / "demo-beat-schedule"))
            )

    def _spawn(self, cmd: list[str], **env: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=_env(**env),
            stdout=self.log,
            stderr=self.log,
            start_new_session=True,  # so a SIGKILL reaches a worker's whole group
            preexec_fn=_die_with_parent,
        )

    @staticmethod
    def app_name(n: int) -> str:
        """The PostgreSQL application_name of worker ``n``'s sessions (libpq reads PGAPPNAME)."""
        return f"zeroloss-demo-worker-{n}"

    def _start(self, n: int) -> subprocess.Popen[bytes]:
        if self.celery:
            return self._spawn(
                celery_worker_command(concurrency=1, loglevel="WARNING", hostname=f"demo{n}@%h"),
                PGAPPNAME=self.app_name(n),
            )
        return self._spawn(
            [
                sys.executable,
                "manage.py",
                "zeroloss_worker",
                "--queue",
                ORDERS,
                "--queue",
                EMAILS,
                "--queue",
                TASKS,
                "--batch-size",
                "10",
            ],
            PGAPPNAME=self.app_name(n),
        )

    def pids(self, proc: subprocess.Popen[bytes]) -> set[int]:
        """The process and its children (Celery's prefork pool runs handlers in children)."""
        pids = {proc.pid}
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(proc.pid)], capture_output=True, text=True)
        pids |= {int(p) for p in out.stdout.split()}
        return pids

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        self.killed.append(proc.pid)

    def alive(self) -> int:
        """Worker processes still running (beat, if any, is not a worker)."""
        return sum(1 for p in self.workers if p.poll() is None)

    def signal_group(self, proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        os.killpg(proc.pid, sig)

    def settle(self, proc: subprocess.Popen[bytes]) -> None:
        """After SIGSTOP: wait until no statement of this worker is still running in PostgreSQL.

        A frozen process sends nothing more, but a claim or acknowledgement it sent just before
        keeps running in its backend and may commit after we count; on SQLite the writes happen
        in the process itself, so freezing it is enough.
        """
        from django.db import connection

        if connection.vendor != "postgresql":
            return
        time.sleep(0.1)  # let the backend read a statement already in its socket
        deadline = time.monotonic() + 10
        with connection.cursor() as cursor:
            while time.monotonic() < deadline:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND state = 'active'",
                    [self.app_name(self.workers.index(proc))],
                )
                if cursor.fetchone()[0] == 0:
                    return
                time.sleep(0.01)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.log.close()


def _held_by(prefix: str, pids: set[int]) -> list[str]:
    """Messages whose lease is held right now by one of ``pids`` (instance ids are host:pid:...)."""
    from zeroloss.ledger.models import Message

    pattern = r":(" + "|".join(str(p) for p in sorted(pids)) + r"):"
    return list(
        Message.objects.filter(
            message_id__startswith=prefix, status="processing", claimed_by__regex=pattern
        ).values_list("message_id", flat=True)
    )


def _counts(prefix: str) -> dict[str, int]:
    from django.db.models import Count

    from project.demo.models import HandledRecord
    from zeroloss.ledger.models import Message, MessageEvent

    mine = Message.objects.filter(message_id__startswith=prefix)
    by_status = {row["status"]: row["n"] for row in mine.values("status").annotate(n=Count("id"))}
    events = MessageEvent.objects.filter(message__message_id__startswith=prefix)
    handled = HandledRecord.objects.filter(message_id__startswith=prefix)
    twice = handled.values("message_id").annotate(n=Count("id")).filter(n__gt=1).count()
    return {
        "stored": sum(by_status.values()),
        "pending": by_status.get("pending", 0),
        "processing": by_status.get("processing", 0),
        "completed": by_status.get("completed", 0),
        "dead": by_status.get("dead", 0),
        # Moved by a sweep: back to pending, or dead when that was the last attempt.
        "recovered": events.filter(actor__startswith="sweep@").count(),
        "handled": handled.values("message_id").distinct().count(),
        "handled_twice": twice,
    }


def _enqueue_receipts(count: int = 3) -> list[str]:
    """The Django task example: ``@task(...).enqueue()`` stores each receipt in the transaction
    of its order; a rolled-back order takes its receipt with it (that one never runs)."""
    from django.db import transaction

    from .tasks import send_receipt

    with transaction.atomic():
        ids = [send_receipt.enqueue(order_id=n).id for n in range(count)]
    try:
        with transaction.atomic():
            send_receipt.enqueue(order_id=-1)
            raise RuntimeError("the order failed: its receipt is rolled back with it")
    except RuntimeError:
        pass
    print(f"enqueued {count} Django tasks (send_receipt.enqueue(), {TASKS}); one more rolled back")
    return ids


def _wait_for_receipts(ids: list[str], deadline: float) -> int:
    """How many of the receipts finished SUCCESSFUL (read back with ``get_result``) by ``deadline``."""
    from .tasks import send_receipt

    while True:
        results = [send_receipt.get_result(i) for i in ids]
        if all(r.is_finished for r in results) or time.monotonic() >= deadline:
            return sum(r.status == "SUCCESSFUL" for r in results)
        time.sleep(0.1)


def _explained(summary: dict[str, Any], fail_every: int, attempts: int) -> list[tuple[str, str]]:
    """Each number the summary prints, with what it counts."""
    orphaned, recovered = summary["orphaned_by_kill"], summary["recovered_by_sweep"]
    if recovered == orphaned:
        sweep = "leases the sweep found expired and put back: exactly the killed worker's"
    else:
        sweep = f"leases the sweep put back: {orphaned} of the killed worker's, {recovered - orphaned} others"
    return [
        ("sent", "messages stored by zeroloss.send(), each in the transaction that sent it"),
        ("completed", "handled and acknowledged, each exactly once (the handlers' records agree)"),
        ("orphaned_by_kill", "leases the SIGKILLed worker held when it died: only the sweep can free them"),
        ("recovered_by_sweep", sweep),
        ("dead_lettered", f"1 email in {fail_every} fails on purpose: dead after {attempts} attempts"),
        ("still_pending_or_processing", "not finished when the demo stopped waiting (0: all finished)"),
        ("lost", "sent, but neither stored nor handled (zero loss: always 0)"),
        ("handled_twice", "messages whose handler's effect was recorded twice (always 0)"),
        ("tasks_enqueued", "Django tasks stored by send_receipt.enqueue() (one more was rolled back)"),
        ("tasks_successful", "of those, finished SUCCESSFUL, read back with get_result()"),
        ("seconds", "from the first send to the last outcome"),
    ]


@contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    tty = sys.stdout.isatty()

    def show(line: str) -> None:
        if tty:
            sys.stdout.write("\r\033[K" + line)
        else:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()

    yield show
    if tty:
        sys.stdout.write("\n")


def main() -> int:
    args = _parse()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    os.environ.setdefault("ZEROLOSS_RETRY_BACKOFF_BASE", "0.2")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection, transaction

    import zeroloss

    celery = settings.ZEROLOSS.get("TRANSPORT") == "celery"
    where = f"{connection.vendor} ({connection.settings_dict['NAME']})"
    print(f"zeroloss demo on {where}, {'Celery workers + beat' if celery else 'built-in database workers'}")

    call_command("migrate", verbosity=0)
    password = secrets.token_urlsafe(9)
    user_model = get_user_model()
    admin, _ = user_model.objects.get_or_create(
        username="admin", defaults={"is_staff": True, "is_superuser": True}
    )
    admin.is_staff = admin.is_superuser = True
    admin.set_password(password)
    admin.save()
    print(f"admin user: admin / {password}")

    run = uuid.uuid4().hex[:8]
    prefix = f"demo-{run}-"
    print(f"run {run}: sending {args.messages} messages to {ORDERS} and {EMAILS} ...")
    started = time.monotonic()
    workers = Workers(args.workers, celery)
    sent = 0
    failing = 0
    emails_max_attempts = 3
    try:
        batch = 100
        for start in range(0, args.messages, batch):
            with transaction.atomic():
                for i in range(start, min(start + batch, args.messages)):
                    if i % 2:
                        fail = (i // 2) % args.fail_every == 0
                        failing += fail
                        zeroloss.send(
                            EMAILS,
                            {"to": f"user{i}@example.com", "fail": fail, "sleep": 0.005},
                            message_id=f"{prefix}{i}",
                            max_attempts=emails_max_attempts,
                        )
                    else:
                        zeroloss.send(ORDERS, {"order": i, "sleep": 0.005}, message_id=f"{prefix}{i}")
                    sent += 1
        print(
            f"sent {sent} messages in {time.monotonic() - started:.1f}s "
            f"({failing} emails are built to fail and will be dead-lettered)"
        )
        receipts = _enqueue_receipts()

        worker_pids = {proc.pid: workers.pids(proc) for proc in workers.workers}
        deadline = time.monotonic() + args.timeout
        next_view = 0.0
        orphaned: list[str] = []
        with _progress(True) as show:
            while time.monotonic() < deadline:
                c = _counts(prefix)
                done = c["completed"] + c["dead"] >= sent
                if not orphaned and not done and c["completed"] > args.messages // 10 and workers.alive() > 1:
                    # Freeze each worker in turn (its whole process group, Celery's pool included);
                    # a frozen worker's leases cannot change, so the count is exact. Kill the first
                    # one caught holding leases, thaw the others.
                    for proc in workers.workers:
                        if proc.poll() is not None:
                            continue
                        held: list[str] = []
                        workers.signal_group(proc, signal.SIGSTOP)
                        try:
                            workers.settle(proc)
                            held = _held_by(prefix, worker_pids[proc.pid])
                        finally:
                            if not held:
                                workers.signal_group(proc, signal.SIGCONT)
                        if not held:
                            continue
                        workers.kill(proc)
                        orphaned = held  # only the sweep can free these now
                        show(f"SIGKILL worker pid {proc.pid}: it died holding {len(orphaned)} lease(s)")
                        if sys.stdout.isatty():
                            sys.stdout.write("\n")
                        break
                if time.monotonic() >= next_view or done:
                    if not orphaned:  # Celery's pool children appear after start-up
                        worker_pids = {proc.pid: workers.pids(proc) for proc in workers.workers}
                    show(
                        f"completed {c['completed']:>5}  dead {c['dead']:>3}  pending {c['pending']:>5}  "
                        f"processing {c['processing']:>3}  recovered by sweep {c['recovered']:>3}  "
                        f"workers alive {workers.alive()}"
                    )
                    next_view = time.monotonic() + 0.5
                if done:
                    break
                # Watch closely for a worker holding leases; after the kill, just report.
                time.sleep(0.01 if not orphaned else 0.25)
        if not orphaned:
            print(
                "note: every message finished before a worker was caught holding a lease; nothing was killed"
            )
        tasks_done = _wait_for_receipts(receipts, deadline)
        final = _counts(prefix)
        lost = sent - final["stored"] + (final["completed"] - final["handled"])
        summary = {
            "run": run,
            "database": connection.vendor,
            "transport": "celery" if celery else "database",
            "sent": sent,
            "completed": final["completed"],
            "recovered_by_sweep": final["recovered"],
            "dead_lettered": final["dead"],
            "still_pending_or_processing": final["pending"] + final["processing"],
            "lost": lost,
            "handled_twice": final["handled_twice"],
            "killed_worker_pids": workers.killed,
            "orphaned_by_kill": len(orphaned),
            "tasks_enqueued": len(receipts),
            "tasks_successful": tasks_done,
            "seconds": round(time.monotonic() - started, 1),
        }
        print("\nsummary (from the ledger and the handlers' own records)")
        for key, meaning in _explained(summary, args.fail_every, emails_max_attempts):
            print(f"  {key.replace('_', ' '):<28} {summary[key]!s:>6}  {meaning}")
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=2))
        if args.no_serve:
            return 0 if lost == 0 and final["handled_twice"] == 0 and orphaned else 1
        print(
            f"\nadmin and dashboard: http://127.0.0.1:{args.port}/admin/  (admin / {password})  Ctrl-C stops"
        )
        server = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", f"127.0.0.1:{args.port}", "--noreload"],
            cwd=ROOT,
            env=_env(),
        )
        try:
            server.wait()
        except KeyboardInterrupt:
            server.send_signal(signal.SIGINT)
            server.wait(timeout=10)
        return 0
    finally:
        workers.stop()


if __name__ == "__main__":
    sys.exit(main())
