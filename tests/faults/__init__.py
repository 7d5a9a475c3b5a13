"""The fault suite: real workers, a real producer, a private PostgreSQL (and Redis), real faults.

- :mod:`.cluster`: the private PostgreSQL cluster (restarts ``-m immediate`` / ``-m fast``,
  ``pg_terminate_backend`` of every ledger session) and a private ``redis-server``;
- :mod:`.zeroloss_handlers`: the workload's handlers (a transactional one whose effect is a row
  per committed run, a plain one), each logging every *start* to an append-only file;
- :mod:`.producer`: a process sending through ``zeroloss.send()`` the whole time, logging
  every send as accepted or refused;
- :mod:`.workload`: worker processes with a supervisor that restarts what was killed;
- :mod:`.injector`: the seeded fault schedule and its execution;
- :mod:`.checker`: the checks over the full history;
- :mod:`.scenario`: the profiles (CI, soak) and the scenarios that tie it all together.

This package is also a Django app, installed only in the processes the suite starts
(``ZEROLOSS_EXTRA_APPS=tests.faults``), so that zeroloss autodiscovers its handlers. It has no
models: its one table is created with plain SQL by :mod:`.cluster`.
"""
