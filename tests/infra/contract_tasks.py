"""``@task`` functions for the task backend's contract tests (tests/ledger/test_tasks_contract.py)."""

from __future__ import annotations

from zeroloss.integrations.tasks_backend.compat import task


class ShadowedError(Exception):
    """An exception class whose module path contains ``builtins.``."""


ShadowedError.__module__ = "mypkg.builtins.errors"


@task()
def raise_shadowed() -> None:
    raise ShadowedError("from a module named builtins")


@task()
def raise_value_error(text: str) -> None:
    raise ValueError(text)


@task()
def returns(value: object) -> object:
    return value
