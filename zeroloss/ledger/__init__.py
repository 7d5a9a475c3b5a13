"""The ledger, by concern. :class:`zeroloss.service.ZeroLossMessageService` puts the parts together:

- :mod:`.persist` — storing messages (idempotency, deduplication windows, ordering keys);
- :mod:`.leases` — claims and renewals; :mod:`.outcomes` — the lease holder's fenced outcomes, one or in batches;
- :mod:`.sweep` — the recovery sweep;
- :mod:`.operator` — requeue, redrive, dead-letter and purge by hand;
- :mod:`.keys` — blocked ordering keys, and skipping or requeueing a key's head;
- :mod:`.dispatch` — bookkeeping for the Celery transport;
- :mod:`.integrity` — reads and integrity checks;
- :mod:`.statements` — every SQL statement, by name, and the edges each moving one declares
  (:mod:`.statements_moves`); :mod:`.postgres` and :mod:`.sqlite` — the engines;
- :mod:`zeroloss.states` — the state machine they implement.
"""
