"""Handlers with time limits for the process-pool tests (tests/process/test_process_pool.py).

A Django app installed only in the worker processes those tests start
(``ZEROLOSS_EXTRA_APPS=tests.infra.timelimits_app``), so that zeroloss autodiscovers its handlers;
the tests import :mod:`.zeroloss_handlers` themselves to send to the same queues. No models:
each run writes a ``project.demo`` ``HandledRecord`` whose ``worker`` says what happened.
"""
