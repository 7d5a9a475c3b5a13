"""Example project settings. Everything that varies comes from the environment.

- ``DATABASE_URL``: ``postgres://user@host:5432/name`` in production; unset means the
  embedded default, a SQLite file in ``var/``.
- ``CELERY_BROKER_URL``: ``redis://127.0.0.1:6379/0`` to use Celery as the transport;
  unset means the built-in database worker (``manage.py zeroloss_worker``).
- ``REDIS_URL``: use django-redis as the cache (status, dashboard, metrics reads).
- ``ZEROLOSS_EXTRA_DATABASES``: more database aliases, as JSON (alias -> URL, or alias -> a full
  ``DATABASES`` entry, for libpq's multi-host form).
- ``ZEROLOSS_DATABASE_JSON``: a whole ``DATABASES["default"]`` entry as JSON, used instead of
  ``DATABASE_URL``. For what a URL cannot say, e.g. libpq's multi-host form behind automatic
  failover (``{"ENGINE": "django.db.backends.postgresql", "HOST": "10.0.0.1,10.0.0.2",
  "PORT": "5432,5432", "OPTIONS": {"target_session_attrs": "read-write"}, ...}``):
  dj-database-url cannot parse multi-host URLs. See docs/high-availability.md.
- ``ZEROLOSS_SETTINGS_JSON``: a JSON object laid over ``ZEROLOSS`` below, e.g.
  ``{"PREPARED_STATEMENTS": false}`` behind PgBouncer in transaction mode (docs/scaling.md).
- ``ZEROLOSS_TEST_SQLITE_MEMORY``: the SQLite test database in memory, on /dev/shm (``make test-fast``).
"""

import atexit
import json
import os
import shutil
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("ZEROLOSS_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "insecure-example-key-change-me")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "zeroloss",
    "project.demo",
]
# Apps a test harness adds to the processes it starts (tests/faults installs its handlers so).
INSTALLED_APPS += [app for app in os.environ.get("ZEROLOSS_EXTRA_APPS", "").split(",") if app]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "project.wsgi.application"

_SQLITE_FILE = VAR_DIR / "zeroloss.sqlite3"
DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{_SQLITE_FILE}", conn_max_age=0
    )
}
if os.environ.get("ZEROLOSS_DATABASE_JSON"):
    DATABASES["default"] = json.loads(os.environ["ZEROLOSS_DATABASE_JSON"])
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = {
        # Writers queue for the lock instead of failing; WAL lets readers run beside them;
        # synchronous=FULL makes every commit survive a power cut, not only a crash.
        "transaction_mode": "IMMEDIATE",
        # Seconds a writer waits for the lock before "database is locked" (tests shorten it).
        "timeout": float(os.environ.get("ZEROLOSS_SQLITE_TIMEOUT", 30)),
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;",
    }
    # A file, so that the worker processes a test starts see the test database. make test-fast
    # keeps it in memory: a file on tmpfs (/dev/shm), one per process, rather than SQLite's
    # shared-cache ":memory:", whose table locks fail the threaded tests instead of waiting.
    _test_dir = VAR_DIR
    if os.environ.get("ZEROLOSS_TEST_SQLITE_MEMORY") and Path("/dev/shm").is_dir():
        _test_dir = Path("/dev/shm") / f"zeroloss-test-{os.getpid()}"
        _test_dir.mkdir(exist_ok=True)
        atexit.register(shutil.rmtree, _test_dir, True)
    DATABASES["default"]["TEST"] = {"NAME": str(_test_dir / "test_zeroloss.sqlite3")}

# More databases, from the environment (tests and several-ledger deployments): a JSON object of
# alias -> URL, or alias -> a full DATABASES entry (needed for libpq's multi-host form, which a
# URL cannot carry).
for _alias, _db in json.loads(os.environ.get("ZEROLOSS_EXTRA_DATABASES") or "{}").items():
    DATABASES[_alias] = dj_database_url.parse(_db, conn_max_age=0) if isinstance(_db, str) else _db

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if os.environ.get("REDIS_URL"):
    CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": os.environ["REDIS_URL"],
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "")

ZEROLOSS = {
    "ACK_TIMEOUT": float(os.environ.get("ZEROLOSS_ACK_TIMEOUT", 5)),
    "MAX_ATTEMPTS": 5,
    "RETRY_BACKOFF": {"BASE": float(os.environ.get("ZEROLOSS_RETRY_BACKOFF_BASE", 1)), "MAX": 300},
    "SWEEP_INTERVAL": float(os.environ.get("ZEROLOSS_SWEEP_INTERVAL", 2)),
    "REDISPATCH_AFTER": float(os.environ.get("ZEROLOSS_REDISPATCH_AFTER", 30)),
    # With a broker, Celery carries messages; without one, the built-in worker polls the ledger.
    "TRANSPORT": "celery" if CELERY_BROKER_URL else "database",
}
ZEROLOSS.update(json.loads(os.environ.get("ZEROLOSS_SETTINGS_JSON") or "{}"))
# Django's Tasks framework (django.tasks on Django 6, the django-tasks backport on 5.2): @task
# functions are stored in the ledger and run by zeroloss_worker (docs/django-tasks.md).
TASKS = {
    "default": {
        "BACKEND": "zeroloss.tasks_backend.ZeroLossBackend",
        "QUEUES": ["default", "demo.tasks"],
        "OPTIONS": {"MAX_ATTEMPTS": 5},
    }
}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {
        "zeroloss": {"handlers": ["stderr"], "level": os.environ.get("ZEROLOSS_LOG_LEVEL", "WARNING")}
    },
}
