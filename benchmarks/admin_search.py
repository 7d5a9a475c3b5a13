"""What one admin search costs at a million messages: exact-id search against the old one.

    python -m benchmarks.admin_search [--rows 1000000] [--runs 7] [--server-url URL] [--keep-db]

Creates its own database (``--db-name``, default ``zeroloss_bench_admin``) on the server of
``--server-url`` / ``ZEROLOSS_BENCH_POSTGRES_URL`` / ``ZEROLOSS_TEST_POSTGRES_URL``, migrates
it, loads ``--rows`` completed messages (three audit rows each) with the benchmark loaders,
ANALYZEs, and times, warm, the median of ``--runs``:

- the search the admin runs now (``zeroloss.admin.search``): the page's rows and its capped
  count, for a message id, in the messages and the audit-event admins;
- the search Django's ``search_fields`` ran before (``=message_id``, ``=queue_name``,
  ``last_error``; ``=message__message_id``, ``=actor``): ``UPPER(...) = UPPER(...)`` OR-ed
  with ``ILIKE``;
- a whole changelist GET with the search (Django's test client, a superuser).

Prints one table and drops the database (unless ``--keep-db``). Never gates on a number.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.db import BenchDatabase, analyze, load_messages, server_url  # noqa: E402


def median_ms(fn: Callable[[], Any], runs: int) -> float:
    fn()  # warm: plan cache, buffers
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def measure(rows: int, runs: int) -> list[tuple[str, float, str]]:
    import django
    from django.contrib import admin
    from django.contrib.auth.models import User
    from django.db import connection
    from django.test import Client, RequestFactory

    django.setup()
    from zeroloss.admin import paginator, search
    from zeroloss.ledger.models import Message, MessageEvent

    term = f"bench-{rows // 2}"
    request = RequestFactory().get("/")

    def page_and_count(qs: Any) -> None:
        list(qs.order_by("-id")[:51])
        qs.order_by()[: paginator.COUNT_CAP + 1].count()

    def plan(qs: Any) -> str:
        """The scans of the page query's plan, e.g. ``Index Scan using zeroloss_message_id_uniq``."""
        text = qs.order_by("-id")[:51].explain()
        scans = re.findall(
            r"((?:Bitmap )?(?:Seq|Index|Index Only) Scan(?: Backward)? (?:using|on) \w+)", text
        )
        return "; ".join(dict.fromkeys(scans))

    class OldMessageAdmin(admin.ModelAdmin):
        search_fields = ("=message_id", "=queue_name", "last_error")

    class OldEventAdmin(admin.ModelAdmin):
        search_fields = ("=message__message_id", "=actor")

    old_messages = OldMessageAdmin(Message, admin.site)
    old_events = OldEventAdmin(MessageEvent, admin.site)

    queries = {
        "messages, exact id (now)": search.search_messages(Message.objects.all(), term),
        "messages, id: prefix (now)": search.search_messages(Message.objects.all(), f"id:{term}"),
        "messages, old search_fields": old_messages.get_search_results(request, Message.objects.all(), term)[
            0
        ],
        "events, exact id (now)": search.search_events(MessageEvent.objects.select_related("message"), term),
        "events, old search_fields": old_events.get_search_results(
            request, MessageEvent.objects.select_related("message"), term
        )[0],
    }
    results = []
    for name, qs in queries.items():
        results.append((name, median_ms(functools.partial(page_and_count, qs), runs), plan(qs)))
    client = Client()
    client.force_login(User.objects.create_superuser("bench", "bench@example.com", "pw"))
    for name, url in (
        ("changelist GET ?q=<id> (now)", "/admin/zeroloss/message/"),
        ("audit events GET ?q=<id> (now)", "/admin/zeroloss/messageevent/"),
    ):

        def get(url: str = url) -> None:
            response = client.get(url, {"q": term})
            assert response.status_code == 200 and term in response.content.decode()

        results.append((name, median_ms(get, runs), "end to end"))
    connection.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.admin_search",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="Messages in the ledger.")
    parser.add_argument("--runs", type=int, default=7, help="Timed runs per figure (median shown).")
    parser.add_argument("--server-url", help="Any database URL on the PostgreSQL server to use.")
    parser.add_argument("--db-name", default="zeroloss_bench_admin", help="The database to create and drop.")
    parser.add_argument("--keep-db", action="store_true", help="Do not drop the database at the end.")
    args = parser.parse_args(argv)
    db = BenchDatabase(server_url(args.server_url), args.db_name)
    db.create()
    os.environ["DATABASE_URL"] = db.url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    os.environ["DJANGO_DEBUG"] = "0"  # DEBUG would keep every statement in memory
    try:
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        start = time.perf_counter()
        with db.connect() as conn:
            load_messages(conn, queue="bench", prefix="bench", count=args.rows, state="completed")
            analyze(conn)
        print(f"loaded {args.rows} messages (3 audit rows each) in {time.perf_counter() - start:.0f}s")
        results = measure(args.rows, args.runs)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            db.drop()
    print(f"\n{'search (page of 51 rows + capped count)':<42} {'median ms':>10}  plan")
    for name, ms, plan in results:
        print(f"{name:<42} {ms:>10.2f}  {plan}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
