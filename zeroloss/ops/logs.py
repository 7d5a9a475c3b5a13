"""The ``zeroloss`` logger on a command's stderr, with ``-v`` as Django's own commands read it.

``-v 0`` errors only, ``-v 1`` (the default) warnings and errors, ``-v 2`` also INFO, ``-v 3``
also DEBUG. When the project's ``LOGGING`` already gives the ``zeroloss`` logger (or an
ancestor it propagates to) a handler, no second one is added, so no line is printed twice; the
project's level is then kept unless ``-v`` was given explicitly other than 1.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..integrations import telemetry

LOGGER = "zeroloss"
LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class TraceIds(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` (hex) to a record made while a span is active
    (``zeroloss[otel]``; AppConfig.ready installs it on the ``zeroloss`` logger)."""

    def filter(self, record: logging.LogRecord) -> bool:

        try:
            ids = telemetry.current_ids()
        except Exception:  # invalid settings, a broken tracer: the record goes out without ids
            ids = None
        if ids is not None:
            record.trace_id, record.span_id = ids
        return True


@contextmanager
def command_logging(verbosity: int, stream: Any) -> Iterator[logging.Handler | None]:
    """For the duration of a command: records of ``zeroloss`` at the level ``verbosity`` asks
    for, printed to ``stream`` unless the project's logging configuration already prints them.
    Yields the handler it added (None when the project's own handlers are used)."""
    logger = logging.getLogger(LOGGER)
    level = LEVELS.get(verbosity, logging.DEBUG)
    previous = logger.level
    added: logging.Handler | None = None
    if not logger.hasHandlers():
        added = logging.StreamHandler(stream)
        added.setFormatter(logging.Formatter(FORMAT))
        logger.addHandler(added)
        logger.setLevel(level)
    elif verbosity != 1:
        logger.setLevel(level)  # the project's handlers print; an explicit -v decides what reaches them
    try:
        yield added
    finally:
        if added is not None:
            logger.removeHandler(added)
        logger.setLevel(previous)
