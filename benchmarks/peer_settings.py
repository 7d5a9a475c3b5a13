"""Django settings of a task-queue peer process (``benchmarks/task_peers.py``): only the peer.

``BENCHPEER`` names the peer (``tasks-db`` or ``django-q2``), ``BENCHPEER_DATABASE_URL`` its
database. No zeroloss app: the peer runs alone, as its users would run it.
"""

import os

import dj_database_url

PEER = os.environ.get("BENCHPEER", "tasks-db")
SECRET_KEY = "benchmark-peer"
DEBUG = False  # DEBUG=True would keep every SQL statement in memory
USE_TZ = True
DATABASES = {"default": dj_database_url.parse(os.environ["BENCHPEER_DATABASE_URL"], conn_max_age=600)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes"]
LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}

if PEER == "tasks-db":
    INSTALLED_APPS += ["django_tasks", "django_tasks_db"]
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
elif PEER == "django-q2":
    INSTALLED_APPS += ["django_q"]
    # The ORM broker on the same PostgreSQL: one worker process, every success kept (timing).
    Q_CLUSTER = {
        "name": "benchpeer",
        "orm": "default",
        "workers": 1,
        "recycle": 1_000_000,
        "timeout": 60,
        "retry": 120,
        "save_limit": 0,
        "poll": 0.1,
        "catch_up": False,
        "ack_failures": True,
        "log_level": "WARNING",
    }
else:
    raise RuntimeError(f"unknown BENCHPEER {PEER!r}")
