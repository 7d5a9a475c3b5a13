"""Django settings for benchmark processes: the example project plus the benchmark handlers.

``benchmarks`` is an installed app only so that ``zeroloss`` autodiscovers
``benchmarks/zeroloss_handlers.py`` (the ``bench.*`` queues) in every worker process.
"""

import os

import dj_database_url

from project.settings import *  # noqa: F403
from project.settings import DATABASES, INSTALLED_APPS, TASKS, ZEROLOSS

INSTALLED_APPS = [*INSTALLED_APPS, "benchmarks"]
DEBUG = False  # DEBUG=True would keep every SQL statement in memory (connection.queries)

# The tasks_sigkill workload's @task (benchmarks/tasks.py) runs on its own task queue.
TASKS = {
    **TASKS,
    "default": {**TASKS["default"], "QUEUES": [*TASKS["default"]["QUEUES"], "bench.tasks"]},
}

# The suite's second database (retained rows), next to the empty one, for paired runs.
if os.environ.get("ZEROLOSS_BENCH_RETAINED_URL"):
    DATABASES["retained"] = dj_database_url.parse(os.environ["ZEROLOSS_BENCH_RETAINED_URL"], conn_max_age=0)

# One-commit-per-outcome runs (the 0.1 behaviour, measured beside the batched default).
for _name in ("ACK_BATCH_SIZE",):
    if os.environ.get(f"ZEROLOSS_BENCH_{_name}"):
        ZEROLOSS[_name] = int(os.environ[f"ZEROLOSS_BENCH_{_name}"])
