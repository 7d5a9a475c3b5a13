"""The example project's settings without ``LOGGING``, as a fresh ``startproject`` has them
(tests/ledger/test_logging.py: what ``zeroloss_worker`` prints on its own)."""

from project.settings import *  # noqa: F403

LOGGING = {}
