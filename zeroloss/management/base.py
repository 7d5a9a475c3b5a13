"""Conventions shared by every zeroloss command.

- results on stdout (a table by default, ``--json`` for scripts), logs on stderr;
- ``--database ALIAS``;
- exit codes: 0 success, 1 a warning condition, 2 bad arguments (argparse style) or a
  critical condition, documented per command;
- durations written ``90s``, ``15m``, ``2h``, ``7d``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections

from ..service import ZeroLossMessageService

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``7d`` -> seconds. Raises ``argparse.ArgumentTypeError``."""
    match = _DURATION_RE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number and a unit, like 90s, 15m, 2h, 7d"
        )
    return float(match.group(1)) * _UNITS[match.group(2)]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: expected a whole number >= 1") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: expected a whole number >= 1")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: expected seconds > 0") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"invalid number {text!r}: expected seconds > 0")
    return value


class ZeroLossCommand(BaseCommand):
    """Base class: adds ``--database`` and ``--json`` and a service bound to that database."""

    json_option = True

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parser.add_argument("--database", default="default", help="Database alias (default: %(default)s).")
        if self.json_option:
            parser.add_argument("--json", action="store_true", help="Print machine-readable JSON on stdout.")
        return parser

    def service(self, options: dict[str, Any]) -> ZeroLossMessageService:
        alias = options["database"]
        if alias not in connections.databases:
            raise CommandError(
                f"Unknown database alias {alias!r}; configured: {', '.join(connections.databases)}.",
                returncode=2,
            )
        return ZeroLossMessageService(using=alias, instance_id=f"cli:{self.command_name()}")

    def command_name(self) -> str:
        return self.__class__.__module__.rsplit(".", 1)[-1]

    def emit_json(self, data: Any) -> None:
        self.stdout.write(json.dumps(data, indent=2, sort_keys=True, default=str))

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
        for n, row in enumerate(cells):
            self.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
            if n == 0:
                self.stdout.write("  ".join("-" * w for w in widths))

    def log(self, message: str) -> None:
        self.stderr.write(message)

    @staticmethod
    def is_tty() -> bool:
        return sys.stdout.isatty()
