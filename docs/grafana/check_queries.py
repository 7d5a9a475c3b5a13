"""Run every panel query of zeroloss-dashboard.json against a real Prometheus scraping a real
worker and the ledger endpoint; exit 1 if any query fails or returns nothing.

    python docs/grafana/check_queries.py      (from the repository root, in the dev environment)

Needs the ``prometheus`` binary on the PATH (Debian: ``apt-get install prometheus``). It starts,
on a scratch SQLite database: ``zeroloss_worker --metrics-port`` (the event metrics, with
``PROMETHEUS_MULTIPROC_DIR``), ``runserver`` (``/zeroloss/metrics/``: the ledger gauges),
Prometheus scraping both every second; sends messages (some failing), then queries each panel's
expressions over the API. Everything it started is stopped at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = Path(__file__).with_name("zeroloss-dashboard.json")
#: Events this run does not cause (a lease lost between a handler's end and its ack, a cancel): their
#: series do not exist yet, so the query answers an empty vector; it must still parse.
NO_EVENT = ("zeroloss_messages_lease_lost_total", "zeroloss_messages_cancelled_total")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return str(r.read().decode())


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            get(url)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def real_run(rounds: int = 20, pause: float = 0.5) -> Iterator[str]:
    """Start the worker, runserver and Prometheus on a scratch SQLite database, send ``rounds``
    rounds of messages ``pause`` seconds apart, wait for the scrapes, and yield Prometheus's base
    URL; stop everything on exit."""
    work = Path(tempfile.mkdtemp(prefix="zl-grafana-check-"))
    prom_dir = work / "multiproc"
    prom_dir.mkdir()
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{work / 'db.sqlite3'}",
        "PROMETHEUS_MULTIPROC_DIR": str(prom_dir),
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "project.settings",
    }
    py = sys.executable
    subprocess.run([py, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    worker_port, web_port, prom_port = free_port(), free_port(), free_port()
    (work / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: worker\n    static_configs: [{{targets: ['127.0.0.1:{worker_port}']}}]\n"
        f"  - job_name: ledger\n    metrics_path: /zeroloss/metrics/\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{web_port}']}}]\n"
    )
    procs: list[subprocess.Popen[bytes]] = []
    log = (work / "processes.log").open("wb")
    try:
        procs.append(
            subprocess.Popen(
                [
                    py,
                    "manage.py",
                    "zeroloss_worker",
                    "--queue",
                    "demo.record",
                    "--metrics-port",
                    str(worker_port),
                    "--poll-interval",
                    "0.2",
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        procs.append(
            subprocess.Popen(
                [py, "manage.py", "runserver", "--noreload", f"127.0.0.1:{web_port}"],
                cwd=ROOT,
                # Scraped for the ledger gauges only: with the shared directory it would serve
                # the worker's and sender's event counts as well, and every sum would double.
                env={k: v for k, v in env.items() if k != "PROMETHEUS_MULTIPROC_DIR"},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        procs.append(
            subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={work / 'prometheus.yml'}",
                    f"--storage.tsdb.path={work / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        wait_http(f"http://127.0.0.1:{worker_port}/metrics")
        wait_http(f"http://127.0.0.1:{web_port}/zeroloss/metrics/")
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready")
        send = (
            "import zeroloss\n"
            f"for round in range({rounds}):\n"
            "    zeroloss.send_many('demo.record', [{} for _ in range(10 + 10 * (round % 4))])\n"
            "    zeroloss.send('demo.record', {'fail': True}, max_attempts=1)\n"
            "    zeroloss.send('demo.record', {}, delay=3600)\n"
            f"    import time; time.sleep({pause})\n"
            # A claim never acknowledged: its lease runs out, the worker's sweep recovers it.
            "from zeroloss.service import ZeroLossMessageService\n"
            "zeroloss.send('demo.record', {}, message_id='abandoned')\n"
            "ZeroLossMessageService(ack_timeout=0.5, instance_id='gone').claim_message('abandoned')\n"
        )
        subprocess.run([py, "manage.py", "shell", "-c", send], cwd=ROOT, env=env, check=True)
        time.sleep(15)  # several scrapes after the last messages ran: rate() needs two samples
        yield f"http://127.0.0.1:{prom_port}"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    if shutil.which("prometheus") is None:
        print("prometheus is not on the PATH (apt-get install prometheus)", file=sys.stderr)
        return 2
    with real_run() as prometheus:
        base = f"{prometheus}/api/v1/query?query="
        failed = 0
        for panel in json.loads(DASHBOARD.read_text())["panels"]:
            for target in panel["targets"]:
                expr = target["expr"].replace("$__rate_interval", "1m")
                answer = json.loads(get(base + urllib.parse.quote(expr)))
                series = answer.get("data", {}).get("result", [])
                empty_ok = any(name in expr for name in NO_EVENT)
                ok = answer.get("status") == "success" and (bool(series) or empty_ok)
                failed += not ok
                shown = ", ".join(
                    f"{s['metric'].get('queue', '')}{'/' + s['metric']['by'] if 'by' in s['metric'] else ''}="
                    f"{float(s['value'][1]):.4g}"
                    for s in series[:3]
                )
                note = shown or ("(no such event in this run: empty, parsed)" if ok else answer)
                print(f"{'ok  ' if ok else 'FAIL'} {panel['title']}: {expr}\n     -> {note}")
        print(f"\n{'all queries returned data' if not failed else f'{failed} queries failed'}")
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
