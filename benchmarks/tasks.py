"""The benchmark's Django task (``TASKS`` in ``benchmarks/settings.py`` lists ``bench.tasks``).

``hang_first_attempt``: on its first attempt writes a marker (pid, time) and hangs, so the suite
can SIGKILL the worker that runs it; on a later attempt writes a marker and returns.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from zeroloss.integrations.tasks_backend.compat import task

from .db import MARKER_DIR_ENV


@task(queue_name="bench.tasks", takes_context=True)
def hang_first_attempt(context, run: int) -> dict[str, int]:
    started = time.time()
    directory = Path(os.environ.get(MARKER_DIR_ENV, "."))
    marker = directory / f"{context.task_result.id}.{context.attempt}"
    tmp = directory / f".{marker.name}.tmp"
    tmp.write_text(json.dumps({"pid": os.getpid(), "t": started, "attempt": context.attempt}))
    tmp.rename(marker)
    if context.attempt == 1:
        deadline = time.monotonic() + 120  # the suite SIGKILLs this process long before
        while time.monotonic() < deadline:
            time.sleep(0.05)
    return {"run": run, "attempt": context.attempt}
