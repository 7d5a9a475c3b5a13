"""The ledger, by part. :class:`zeroloss.service.ZeroLossMessageService` names their operations: it
builds one :class:`.base.LedgerContext` and a part of each kind over it (no part inherits another; a part
calls a sibling through the context):

- :mod:`.persist` (``Store``) — storing messages (idempotency, deduplication windows, ordering
  keys); :mod:`.bulk` its large batches;
- :mod:`.leases` (``Leases``) — claims and renewals; :mod:`.outcomes` (``Outcomes``) — the lease
  holder's fenced outcomes, one or in batches; :mod:`.aborts` (``Aborts``) — aborts in hand;
- :mod:`.control` (``Control``) — pause, limits, and what they allow each claim;
- :mod:`.sweep` (``Recovery``) — the recovery sweep and key repair;
- :mod:`.operator` (``Operator``) — requeue, redrive, dead-letter, cancel and purge by hand;
- :mod:`.keys` (``Keys``) — blocked ordering keys, and skipping or requeueing a key's head;
- :mod:`.dispatch` (``Dispatch``) — bookkeeping for the Celery transport;
- :mod:`.integrity` (``Reads``) — reads and integrity checks; :mod:`.nodes` (``Nodes``) — the
  replication node registry;
- :mod:`.surface` — ``operation``: a service's flat name *is* a part's method; :mod:`.deprecated`
  — the old names of renamed ones;
- :mod:`.events` — what the ledger did, published after commit to its subscribers (signals, log
  records, telemetry, waiters), which it never imports;
- :mod:`.statements` — every SQL statement, by name, and the edges each moving one declares
  (:mod:`.statements_moves`); :mod:`.postgres` and :mod:`.sqlite` — the engines;
- :mod:`zeroloss.core.states` — the state machine they implement.
"""
