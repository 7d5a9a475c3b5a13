"""The scheduler's statements, by name: written whole, as each database runs them, in
``statements.sql`` beside this module (see :mod:`zeroloss.ledger.catalogue`)."""

from __future__ import annotations

from pathlib import Path

from ...ledger.catalogue import Catalogue

CATALOGUE = Catalogue(Path(__file__).with_name("statements.sql"))
