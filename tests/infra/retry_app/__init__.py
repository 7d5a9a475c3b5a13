"""Handlers with retry policies for the retry-policy tests (tests/ledger/test_retry_policy*.py).

A Django app installed only in the worker processes those tests start
(``ZEROLOSS_EXTRA_APPS=tests.infra.retry_app``), so that zeroloss autodiscovers its handlers; the
tests import :mod:`.zeroloss_handlers` themselves to send to the same queues (and to drain them).
"""
