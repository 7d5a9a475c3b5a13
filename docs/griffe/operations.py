"""A Griffe extension for the reference docs: the service's flat names are its parts' operations.

``claim = operation(Leases.claim)`` (zeroloss.ledger.surface) reads, to a static reader, as an
attribute without a docstring; this documents each such name as the method it is, with the
part's signature and docstring. ``deprecated(...)`` names get their warning as the docstring.
"""

from __future__ import annotations

from typing import Any

import griffe

SERVICE = "zeroloss.service.ZeroLossMessageService"
DECLARATIONS = {"operation", "deprecated"}
RENAMED_FROM = "zeroloss.ledger.deprecated"


class Operations(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.path != "zeroloss":
            return
        service = loader.modules_collection.get_member(SERVICE)
        if service.is_alias:  # the public path re-exports the class from where it is defined
            service = service.final_target
        renamed = _renamed(loader)
        for name, member in list(service.members.items()):
            target = _declared(member)
            if target is None:
                continue
            kind, path = target
            function = loader.modules_collection.get_member(path)
            method = griffe.Function(
                name,
                lineno=member.lineno,
                endlineno=member.endlineno,
                parameters=function.parameters,
                returns=function.returns,
                docstring=function.docstring,
            )
            if kind == "deprecated":
                text = f"Deprecated: use `{renamed.get(name, '?')}` (warns `DeprecationWarning`; removed in 0.4)."
                method.docstring = griffe.Docstring(text, parent=method)
            service.set_member(name, method)


def _declared(member: Any) -> tuple[str, str] | None:
    """``(operation|deprecated, the part method's path)`` of a declaration, else None."""
    value = getattr(member, "value", None)
    if not isinstance(value, griffe.ExprCall) or str(value.function) not in DECLARATIONS:
        return None
    argument = value.arguments[0]
    while isinstance(argument, griffe.ExprCall):  # a wrapper: refusing_for_storage(Store.persist_message)
        argument = argument.arguments[0]
    return str(value.function), argument.canonical_path


def _renamed(loader: griffe.GriffeLoader) -> dict[str, str]:
    table = loader.modules_collection.get_member(f"{RENAMED_FROM}.RENAMED").value
    return {str(k).strip("'\""): str(v).strip("'\"") for k, v in zip(table.keys, table.values, strict=True)}
