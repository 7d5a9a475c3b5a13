"""The worker's supervisor (zeroloss.runtime.worker.supervisor): one table of the parts a worker runs,
each restarted or ending the worker by its policy, and the health file saying so.

Real workers on real threads and the real database; a part that dies is a part declared on the
worker's supervisor, the way the command declares the metrics server's thread.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

import zeroloss
from tests.support import finish
from zeroloss.ledger.models import Message
from zeroloss.ledger.service import ZeroLossMessageService, wait_until
from zeroloss.runtime.delivery import Delivery
from zeroloss.runtime.sweep_loop import StopFlag
from zeroloss.runtime.worker import Worker
from zeroloss.runtime.worker.supervisor import (
    CLAIMER,
    KEEPER,
    PARTS,
    SCHEDULER,
    SWEEP,
    Part,
    Policy,
    Supervisor,
)

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "test.supervised"


@zeroloss.handler(QUEUE)
def handled(delivery: Delivery) -> None:
    pass


def health(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def completed() -> int:
    return Message.objects.filter(queue_name=QUEUE, status="completed").count()


def runs_until_the_part_dies(worker: Worker, message_id: str, ends: threading.Event) -> None:
    """Run ``worker`` until one message is done, then set ``ends`` (its part dies) and wait,
    bounded, for the worker to stop of it."""
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        ZeroLossMessageService().persist_message(message_id, QUEUE, {})
        assert wait_until(lambda: completed() == 1, timeout=30)
        assert wait_until(
            lambda: worker.health_file is None or health(worker.health_file).get("status") == "ok", 30
        )
        assert thread.is_alive()
        ends.set()
        thread.join(60)
        assert not thread.is_alive(), "the worker did not stop after its part died"
    finally:
        ends.set()
        worker.stop.set("test")
        thread.join(60)


def test_the_table_names_every_part_once_with_a_policy():
    names = [p.name for p in PARTS]
    assert len(names) == len(set(names))
    assert {p.policy for p in PARTS} == {Policy.RESTART, Policy.EXIT}
    # What the audit trail calls each part: named, not numbered.
    assert (CLAIMER.actor.format(n=3), KEEPER.actor, SWEEP.actor, SCHEDULER.actor) == (
        "t3",
        "keeper",
        "sweep",
        "schedule",
    )
    docs = (Path(__file__).resolve().parents[2] / "docs" / "worker.md").read_text()
    assert all(f"`{name}`" in docs for name in names), "docs/worker.md lists every part and its policy"


def test_a_thread_started_elsewhere_must_end_the_worker_when_it_dies():
    with pytest.raises(ValueError, match="policy must be EXIT"):
        Supervisor(StopFlag()).watch(
            Part("probe", Policy.RESTART, own_thread=True), threading.current_thread()
        )


def test_the_workers_actors_are_its_parts_names():
    worker = Worker([QUEUE])
    assert worker.service_for(SWEEP.actor).instance_id == f"{worker.base.instance_id}/sweep"
    assert worker.keeper.service.instance_id == f"{worker.base.instance_id}/keeper"


def test_a_restartable_part_that_dies_is_restarted_and_the_health_file_says_so(tmp_path):
    path = tmp_path / "health.json"
    runs: list[int] = []
    worker = Worker([QUEUE], stop=StopFlag(), poll_interval=0.05, health_file=path, health_interval=0.02)

    def flaky() -> None:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("probe failed")
        worker.stop.wait(3600)

    worker.supervisor.add(Part("probe", Policy.RESTART, own_thread=True), flaky)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert wait_until(
            lambda: health(path).get("parts", {}).get("probe", {}).get("restarts") == 1, timeout=30
        )
        state = health(path)["parts"]["probe"]
        assert state["alive"] and state["failures"] == 1 and state["policy"] == "restart"
        assert "RuntimeError: probe failed" in state["last_error"]
        # The worker kept processing meanwhile.
        ZeroLossMessageService().persist_message("s1", QUEUE, {})
        assert wait_until(lambda: completed() == 1, timeout=30)
        assert not worker.stats.crashed and thread.is_alive()
    finally:
        finish(worker, thread)
    final = health(path)
    assert final["status"] == "stopped" and final["stopped_on"] == "test"
    assert len(runs) == 2


def test_a_part_whose_policy_is_exit_ends_the_worker_and_the_health_file_says_which(tmp_path):
    path = tmp_path / "health.json"
    dying = threading.Event()

    def fatal() -> None:
        dying.wait(60)
        raise RuntimeError("probe broke")

    worker = Worker([QUEUE], stop=StopFlag(), poll_interval=0.05, health_file=path, health_interval=0.02)
    worker.supervisor.add(Part("probe", Policy.EXIT, own_thread=True), fatal)
    runs_until_the_part_dies(worker, "e1", dying)
    assert worker.stats.crashed and not worker.stats.gave_up
    assert worker.stats.exit_part == "probe"
    final = health(path)
    assert final["status"] == "stopped" and final["stopped_on"] == "crash"
    assert final["parts"]["probe"]["failures"] == 1 and not final["parts"]["probe"]["alive"]
    # Every real part ran, and the claimer and keeper stopped with the worker, not of a failure.
    assert {"claimer-0", "keeper"} <= set(final["parts"])
    assert final["parts"]["claimer-0"]["failures"] == final["parts"]["keeper"]["failures"] == 0


def test_a_round_that_fails_is_tried_again_after_a_backoff(tmp_path):
    """The health file's own round: a write into a missing directory fails, logged, and the
    file appears once the directory does (policy: restart)."""
    path = tmp_path / "not-yet" / "health.json"
    worker = Worker([QUEUE], stop=StopFlag(), poll_interval=0.05, health_file=path, health_interval=0.02)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        units = worker.supervisor.parts
        assert wait_until(lambda: any(u.name == "health-file" and u.failures for u in units), timeout=30)
        [unit] = [u for u in units if u.name == "health-file"]
        assert "FileNotFoundError" in unit.last_error
        path.parent.mkdir()
        assert wait_until(lambda: health(path).get("status") == "ok", timeout=30)
        assert health(path)["parts"]["health-file"]["restarts"] >= 1
        assert thread.is_alive() and not worker.stats.crashed
    finally:
        finish(worker, thread)


def test_a_worker_that_ends_leaves_no_part_failed(tmp_path):
    """A burst worker ends without its stop flag: the parts it stops then (the listener on
    PostgreSQL) are done, not failed, and nothing is restarted."""
    path = tmp_path / "health.json"
    ZeroLossMessageService().persist_message("b1", QUEUE, {})
    stats = Worker([QUEUE], burst=True, poll_interval=0.05, health_file=path, health_interval=0.02).run()
    assert stats.handled == 1 and not stats.crashed and stats.exit_part == ""
    parts = health(path)["parts"]
    assert {"claimer-0", "keeper", "sweep", "scheduler", "health-file"} <= set(parts)
    assert all(p["failures"] == 0 and p["restarts"] == 0 for p in parts.values()), parts


def test_a_watched_thread_that_ends_ends_the_worker():
    """As --metrics-port's server thread: started elsewhere, it cannot be restarted."""
    from zeroloss.runtime.worker.supervisor import METRICS

    serving = threading.Event()
    server = threading.Thread(target=serving.wait, args=(60,), daemon=True)
    server.start()
    worker = Worker([QUEUE], stop=StopFlag(), poll_interval=0.05)
    worker.supervisor.watch(METRICS, server)
    runs_until_the_part_dies(worker, "w1", serving)  # setting it ends the server's thread
    assert worker.stats.crashed and worker.stats.exit_part == "metrics"
    assert worker.stop.signal_name == "crash"
