"""The example project's settings with ``LANGUAGE_CODE = "de"`` (tests/ledger/test_translations.py: the
real command line speaks the language its settings name)."""

from project.settings import *  # noqa: F403

LANGUAGE_CODE = "de"
