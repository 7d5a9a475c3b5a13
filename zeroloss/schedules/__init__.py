"""Public paths of the schedule helpers documented in docs/schedules.md; the schedules live in
:mod:`zeroloss.runtime.schedules`."""
