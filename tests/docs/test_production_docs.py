"""docs/production.md's unit files and manifests, checked and run.

- ```` ```ini ```` blocks are systemd units (``configparser``, ``strict=False``): every long-running
  unit restarts forever (no start limit, ``Restart=always``), stops with SIGTERM to the main
  process and a timeout; each ``ExecStart`` that runs ``manage.py`` is parsed by the command's
  own parser, each ``celery`` one by Celery's (``--help`` after the arguments: Click rejects an
  unknown option before it prints anything).
- ```` ```yaml ```` blocks are Kubernetes manifests (PyYAML): every container ``command`` is
  checked the same way.
- The worker unit's command really runs (``--burst`` appended) against the test database; the
  Kubernetes liveness probe really runs against a real worker's health file.
- The connection counts the guide states are measured from ``pg_stat_activity``.
"""

from __future__ import annotations

import configparser
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.db import connection

import zeroloss
from project.demo.models import HandledRecord
from tests.conftest import ROOT, child_env
from tests.support.docs import Block, blocks, check_manage
from tests.support.factories import retention_not_due
from tests.support.processes import Proc
from tests.support.waiting import hold_for
from zeroloss.ledger.models import Message, Status
from zeroloss.ledger.service import ZeroLossMessageService, wait_until

GUIDE = ROOT / "docs" / "production.md"


def _units() -> list[tuple[Block, configparser.ConfigParser]]:
    found = []
    for block in blocks(GUIDE):
        if block.info != "ini":
            continue
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
        parser.read_string(block.text, source=block.where)
        found.append((block, parser))
    return found


def _manifests() -> list[tuple[Block, dict[str, Any]]]:
    return [
        (block, doc)
        for block in blocks(GUIDE)
        if block.info == "yaml"
        for doc in yaml.safe_load_all(block.text)
        if doc
    ]


UNITS = _units()
MANIFESTS = _manifests()


def _expand(text: str) -> str:
    """The systemd specifiers the units use, for instance 1."""
    return text.replace("%i", "1").replace("%%", "%")


def _exec_start(unit: configparser.ConfigParser) -> list[str]:
    return shlex.split(_expand(unit["Service"]["ExecStart"]))


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    return list(spec["template"]["spec"]["containers"])


def _manage_args(argv: list[str]) -> list[str] | None:
    """The arguments after ``manage.py`` (``None`` if the line does not run manage.py)."""
    for i, word in enumerate(argv):
        if Path(word).name == "manage.py":
            assert Path(argv[i - 1]).name.startswith("python"), f"{argv}: manage.py run by {argv[i - 1]}"
            return argv[i + 1 :]
    return None


def _command_lines() -> Iterator[tuple[Block, str, list[str]]]:
    for block, unit in UNITS:
        if unit.has_option("Service", "ExecStart"):
            yield block, unit["Unit"]["Description"], _exec_start(unit)
    for block, doc in MANIFESTS:
        for container in _containers(doc):
            yield block, f"{doc['metadata']['name']}/{container['name']}", list(container["command"])


COMMANDS = list(_command_lines())


def _worker_unit() -> list[str]:
    [argv] = [
        _exec_start(unit)
        for _, unit in UNITS
        if (_manage_args(_exec_start(unit)) or [""])[0] == "zeroloss_worker"
    ]
    return argv


def _worker_container() -> dict[str, Any]:
    [container] = [
        c
        for _, doc in MANIFESTS
        if doc["kind"] == "Deployment"
        for c in _containers(doc)
        if (_manage_args(c["command"]) or [""])[0] == "zeroloss_worker"
    ]
    return container


def _with_health_file(argv: list[str], path: Path) -> list[str]:
    i = argv.index("--health-file")
    return [*argv[: i + 1], str(path), *argv[i + 2 :]]


def _local(argv: list[str]) -> list[str]:
    """A documented manage.py line as this checkout runs it: this interpreter, this manage.py."""
    args = _manage_args(argv)
    assert args is not None
    return [sys.executable, str(ROOT / "manage.py"), *args]


# -- what the guide contains ------------------------------------------------------------


def test_the_guide_has_every_unit_and_manifest():
    commands = {(_manage_args(argv) or [Path(argv[0]).name, argv[3]])[0] for _, _, argv in COMMANDS}
    assert {"zeroloss_worker", "zeroloss_sweep", "zeroloss_purge", "celery"} <= commands
    assert len(UNITS) == 4
    kinds = sorted(doc["kind"] for _, doc in MANIFESTS)
    assert kinds == ["CronJob", "Deployment", "Deployment"]
    assert any(argv[3] == "beat" for _, _, argv in COMMANDS if Path(argv[0]).name == "celery")


@pytest.mark.parametrize(("block", "unit"), UNITS, ids=[u["Unit"]["Description"] for _, u in UNITS])
def test_every_unit_restarts_forever_and_stops_gently(block, unit):
    assert unit["Unit"]["StartLimitIntervalSec"] == "0", f"{block.where}: a start limit gives up for good"
    service = unit["Service"]
    assert service["Restart"] == "always"
    assert float(service["RestartSec"]) >= 1
    assert service["KillMode"] == "mixed"  # SIGTERM to the main process, SIGKILL to all at the timeout
    assert service.get("KillSignal", "SIGTERM") == "SIGTERM"
    assert int(service["TimeoutStopSec"]) >= 30
    assert service["Type"] == "exec"
    if _manage_args(_exec_start(unit)) is not None:
        assert service["RestartPreventExitStatus"] == "2"  # a configuration error is not retried
    assert unit["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.parametrize(("block", "name", "argv"), COMMANDS, ids=[name for _, name, _ in COMMANDS])
def test_every_command_line_is_accepted_by_its_own_parser(block, name, argv):
    args = _manage_args(argv)
    if args is not None:
        check_manage(block, args)
        return
    assert Path(argv[0]).name == "celery", f"{block.where}: {argv}"
    assert argv[1:3] == ["-A", "proj"]
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "project", *argv[3:], "--help"],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{block.where}: celery rejected {argv[3:]}: {done.stderr}"


def test_the_deployments_stop_gently_and_probe_liveness_only():
    for _, doc in MANIFESTS:
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] >= 30
        for container in pod["containers"]:
            assert "readinessProbe" not in container  # no Service: readiness would gate nothing
            assert container["command"][0] == "python"  # exec form: SIGTERM reaches Python
    container = _worker_container()
    probe = container["livenessProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 60
    mount = container["volumeMounts"][0]["mountPath"]
    health = container["command"][container["command"].index("--health-file") + 1]
    assert health.startswith(mount + "/")
    assert health in probe["exec"]["command"][-1]


def test_the_worker_units_health_file_lives_in_its_runtime_directory():
    [unit] = [u for _, u in UNITS if "zeroloss_worker" in u["Service"]["ExecStart"]]
    argv = _exec_start(unit)
    health = Path(argv[argv.index("--health-file") + 1])
    assert health.parent == Path("/run") / _expand(unit["Service"]["RuntimeDirectory"])


# -- the commands run --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_worker_units_command_runs(tmp_path: Path):
    service = ZeroLossMessageService()
    service.persist_messages([(f"unit-{i}", "demo.record", {"i": i}) for i in range(25)])
    health = tmp_path / "health.json"
    argv = [*_local(_with_health_file(_worker_unit(), health)), "--burst"]
    done = subprocess.run(argv, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert Message.objects.filter(status=Status.COMPLETED).count() == 25
    assert HandledRecord.objects.count() == 25
    state = json.loads(health.read_text())
    assert state["status"] == "stopped" and state["outcomes"] == {"completed": 25}


def _probe(health: Path) -> int:
    command = _worker_container()["livenessProbe"]["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    code = command[2].replace("/run/zeroloss/health.json", str(health))
    return subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True).returncode


@pytest.mark.django_db(transaction=True)
def test_the_liveness_probe_passes_on_a_running_worker_and_fails_once_it_stops(tmp_path: Path):
    health = tmp_path / "health.json"
    container = _worker_container()
    assert _probe(health) == 1  # no file yet
    worker = Proc(_local(_with_health_file(container["command"], health)), child_env())
    try:
        assert wait_until(health.exists, timeout=60), worker.text
        assert json.loads(health.read_text())["status"] == "ok"
        assert _probe(health) == 0
        first = json.loads(health.read_text())["updated_at"]
        assert wait_until(lambda: json.loads(health.read_text())["updated_at"] > first, timeout=10)
    finally:
        assert worker.terminate() == 0, worker.text
    assert json.loads(health.read_text())["status"] == "stopped"
    assert _probe(health) == 1
    now = time.time()
    health.write_text(json.dumps({"status": "degraded", "updated_at": now}))
    assert _probe(health) == 0  # riding out an outage: alive, do not restart
    health.write_text(json.dumps({"status": "ok", "updated_at": now - 120}))
    assert _probe(health) == 1  # not rewritten for two minutes: hung


# -- the connections the guide states ----------------------------------------------------


def _sessions(app_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            [app_name],
        )
        return int(cursor.fetchone()[0])


def _peak_sessions(app_name: str, seconds: float) -> int:
    seen = [0]
    # sampling: the peak over a window of real time is what is measured
    hold_for(seconds, lambda: seen.append(_sessions(app_name)), interval=0.1)
    return max(seen)


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("concurrency", "flags", "expected"),
    [(1, [], 1 + 3), (4, [], 4 + 3), (4, ["--no-sweep", "--no-schedule", "--no-listen"], 4 + 1)],
    ids=["1-thread", "4-threads", "4-threads-no-sweep-no-schedule-no-listen"],
)
def test_connections_per_zeroloss_worker(concurrency: int, flags: list[str], expected: int):
    app = f"zl-conn-{concurrency}-{len(flags)}"
    argv = [
        *_local(["python", "manage.py", "zeroloss_worker"]),
        "--queue",
        "demo.record",
        "--concurrency",
        str(concurrency),
        *flags,
    ]
    # The retention turn not due (its own connection, for the seconds it runs, is counted apart).
    retention_not_due()
    worker = Proc(argv, child_env(PGAPPNAME=app))
    try:
        # Idle: the claim threads, the sweep and LISTEN have connected; the lease keeper has not
        # (it connects when it first has a lease to renew).
        idle = concurrency + (0 if flags else 2)
        assert wait_until(lambda: _sessions(app) == idle, timeout=60), worker.text
        assert _peak_sessions(app, 1.0) == idle
        # Every thread busy with a 2 s handler, so claims, renewals and the sweep all run.
        ZeroLossMessageService().persist_messages(
            [(f"conn-{app}-{i}", "demo.record", {"sleep": 2}) for i in range(2 * concurrency)]
        )
        assert wait_until(
            lambda: Message.objects.filter(status=Status.PROCESSING).count() >= concurrency, timeout=30
        ), worker.text
        assert _peak_sessions(app, 3.0) == expected, worker.text
    finally:
        assert worker.terminate() == 0, worker.text
    assert wait_until(lambda: _sessions(app) == 0, timeout=15)


REDIS_URL = os.environ.get("ZEROLOSS_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_connections_per_celery_prefork_child(settings):
    import redis

    from project.celery import app as celery_app
    from tests.support.celery import use_broker
    from tests.support.processes import celery_worker

    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    settings.ZEROLOSS = {**settings.ZEROLOSS, "TRANSPORT": "celery"}
    old = celery_app.conf.broker_url
    use_broker(REDIS_URL)
    app = "zl-conn-celery"
    worker = celery_worker(REDIS_URL, concurrency=2, PGAPPNAME=app)
    try:
        assert _sessions(app) == 0  # the parent and idle children hold none
        for i in range(4):
            zeroloss.send("demo.record", {"sleep": 2}, message_id=f"celery-conn-{i}")
        assert wait_until(
            lambda: Message.objects.filter(status=Status.PROCESSING).count() == 2, timeout=30
        ), worker.text
        assert _peak_sessions(app, 3.0) == 3 * 2, worker.text
        assert wait_until(lambda: Message.objects.filter(status=Status.COMPLETED).count() == 4, timeout=60), (
            worker.text
        )
        # Between tasks Celery's Django fix-up has closed each task's connection; the keeper's
        # and the flusher's stay.
        assert wait_until(lambda: _sessions(app) == 2 * 2, timeout=15), _sessions(app)
    finally:
        worker.terminate(timeout=30)
        use_broker(old)
        client.flushdb()
        client.close()
