"""Histogram bucket bounds shared by the Prometheus and OpenTelemetry instruments, and the
version the tracer and meter are named with."""

import functools
from importlib import metadata

#: Seconds: the messaging conventions' advice for durations, then longer handlers.
DURATION = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    30.0,
    60.0,
    300.0,
)
#: Seconds a message waited to be picked up: from milliseconds (a listening worker) to a backlog.
PICKUP = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
#: Messages one claim returned.
BATCH = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


@functools.cache
def version() -> str:
    """zeroloss's installed version (read from its metadata: importing ``zeroloss`` here
    would make an import cycle through the package's lazy names)."""
    try:
        return metadata.version("zeroloss")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return ""
