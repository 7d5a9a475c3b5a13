"""Replication's statements, by name: written whole, as each database runs them, in
``statements.sql`` beside this module (see :mod:`zeroloss.ledger.catalogue`). All but the node
registry's read PostgreSQL's WAL and walsenders: they run where ``Engine.supports_replication``.
"""

from __future__ import annotations

from pathlib import Path

from ...ledger.catalogue import Catalogue

CATALOGUE = Catalogue(Path(__file__).with_name("statements.sql"))
