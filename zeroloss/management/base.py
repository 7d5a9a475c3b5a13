"""Conventions shared by every zeroloss command.

- results on stdout (a table by default, ``--json`` for scripts), logs and prompts on stderr;
- ``--database ALIAS``;
- exit codes, the same meaning in every command (each documents which it uses):

  ====  ==========================================================================
  0     success
  1     a warning condition (``zeroloss_verify``), or some selected messages were not
        changed (``zeroloss_requeue``)
  2     bad arguments (argparse style: usage and ``error:`` on stderr, nothing changed),
        or a critical condition (``zeroloss_verify``)
  3     not confirmed: the prompt was refused, or stdin is not a terminal and ``--yes``
        was not given; nothing changed
  ====  ==========================================================================

- durations written ``90s``, ``15m``, ``2h``, ``7d``;
- commands that change data take ``--dry-run`` (change nothing, report what would change)
  and ``--yes`` (skip the confirmation prompt for many rows or a set-based selection);
- a progress bar on long work, only when stdout is a terminal and ``--json`` is off.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper
from django.db import connections

from ..models import Message
from ..service import ZeroLossMessageService, default_instance_id

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

EXIT_OK = 0
EXIT_WARNING = 1
EXIT_USAGE = 2
EXIT_CRITICAL = 2
EXIT_NOT_CONFIRMED = 3

#: Above this many rows an explicit ID list asks for confirmation (set-based selections always do).
CONFIRM_THRESHOLD = 100


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


def format_duration(seconds: float | None) -> str:
    """Seconds as a short human string: ``-``, ``4.2s``, ``12m05s``, ``3h07m``, ``2d04h``."""
    if seconds is None:
        return "-"
    s = max(0.0, float(seconds))
    if s < 60:
        return f"{s:.1f}s"
    whole = int(s)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{(whole % 3600) // 60:02d}m"
    return f"{whole // 86400}d{(whole % 86400) // 3600:02d}h"


class CommandExit(CommandError):
    """A command finished with a documented non-zero exit code.

    On the command line Django prints ``<ClassName>: <message>`` on stderr and exits with
    ``returncode``; ``call_command`` raises it, so Python callers can read ``returncode``.
    """

    code = EXIT_WARNING

    def __init__(self, message: str) -> None:
        super().__init__(message, returncode=self.code)


class Incomplete(CommandExit):
    """Some selected messages were not changed (exit code 1)."""

    code = EXIT_WARNING


class WarningFound(CommandExit):
    code = EXIT_WARNING


class CriticalFound(CommandExit):
    code = EXIT_CRITICAL


class NotConfirmed(CommandExit):
    """The confirmation prompt was refused or could not be asked; nothing changed (exit code 3)."""

    code = EXIT_NOT_CONFIRMED


class UsageError(CommandError):
    """Bad arguments from ``call_command`` (exit code 2); the command line gets argparse's output."""

    def __init__(self, message: str) -> None:
        super().__init__(f"Error: {message}", returncode=EXIT_USAGE)


class ZeroLossParser(CommandParser):
    """Django's parser, but bad arguments are exit code 2 from ``call_command`` too."""

    def error(self, message: str) -> NoReturn:
        if self.called_from_command_line:
            super().error(message)  # usage + "error: ..." on stderr, exit code 2
        raise UsageError(message)


class Progress:
    """A one-line progress bar on a terminal; does nothing when disabled."""

    def __init__(self, out: OutputWrapper, total: int, label: str, *, enabled: bool) -> None:
        self.out = out
        self.total = max(total, 0)
        self.label = label
        self.enabled = enabled and self.total > 0
        self.done = 0

    def advance(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        width = 30
        fraction = min(self.done / self.total, 1.0)
        filled = int(width * fraction)
        bar = "#" * filled + "-" * (width - filled)
        self.out.write(f"\r{self.label} [{bar}] {self.done}/{self.total}", ending="")
        self.out.flush()

    def close(self) -> None:
        if self.enabled:
            self.out.write("\r\x1b[K", ending="")  # erase the bar: results follow on a clean line
            self.out.flush()


class ZeroLossCommand(BaseCommand):
    """Base class: adds ``--database`` and ``--json`` and a service bound to that database."""

    json_option = True
    #: Commands that change data set this: adds ``--dry-run`` and ``--yes``.
    changes_data = False
    #: ``call_command(..., stdin=...)`` replaces the terminal the prompt reads from.
    stealth_options = ("stdin",)

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # Same parser, stricter error(): exit code 2 from call_command as well.
        parser.__class__ = ZeroLossParser
        parser.add_argument("--database", default="default", help="Database alias (default: %(default)s).")
        if self.json_option:
            parser.add_argument("--json", action="store_true", help="Print machine-readable JSON on stdout.")
        if self.changes_data:
            parser.add_argument(
                "--dry-run", action="store_true", help="Report what would change and change nothing."
            )
            parser.add_argument(
                "--yes", "-y", action="store_true", help="Do not ask for confirmation (for scripts)."
            )
        self._parser = parser
        return parser

    def execute(self, *args: Any, **options: Any) -> Any:
        self._stdin = options.get("stdin") or sys.stdin
        return super().execute(*args, **options)

    # -- arguments ----------------------------------------------------------------------

    def usage_error(self, message: str) -> NoReturn:
        """An argparse-style error: usage and ``error: message`` on stderr, exit code 2."""
        parser = getattr(self, "_parser", None)
        if parser is not None and parser.called_from_command_line:
            parser.error(message)
        raise UsageError(message)

    def service(self, options: dict[str, Any]) -> ZeroLossMessageService:
        alias = options["database"]
        if alias not in connections.databases:
            self.usage_error(
                f"unknown database alias {alias!r}; configured: {', '.join(connections.databases)}"
            )
        return ZeroLossMessageService(using=alias, instance_id=f"cli:{self.command_name()}")

    def actor(self) -> str:
        """A unique actor name for this run, recorded in the audit trail and purge records."""
        return f"cli:{self.command_name()}@{default_instance_id()}"

    def check_queue(self, service: ZeroLossMessageService, queue: str | None) -> str | None:
        """``queue`` if the ledger has messages in it; otherwise a usage error (exit code 2)."""
        if queue is None:
            return None
        messages = Message.objects.using(service.using)
        if not messages.filter(queue_name=queue).exists():
            known = list(messages.values_list("queue_name", flat=True).distinct().order_by("queue_name")[:21])
            listed = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
            self.usage_error(
                f"unknown queue {queue!r}: the ledger has no message in it"
                + (f" (queues: {listed})" if known else " (the ledger is empty)")
            )
        return queue

    def command_name(self) -> str:
        return self.__class__.__module__.rsplit(".", 1)[-1]

    # -- output -------------------------------------------------------------------------

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

    def progress(self, total: int, label: str, options: dict[str, Any]) -> Progress:
        """A progress bar on stdout when it is a terminal (never with ``--json``)."""
        enabled = self.stdout.isatty() and not options.get("json")
        return Progress(self.stdout, total, label, enabled=enabled)

    # -- confirmation -------------------------------------------------------------------

    def confirm(self, question: str, options: dict[str, Any]) -> None:
        """Ask ``question`` on the terminal unless ``--yes``; raise :class:`NotConfirmed` if refused.

        When stdin is not a terminal (cron, CI, a pipe) and ``--yes`` was not given, nothing
        is asked and the command stops, having changed nothing.
        """
        if options.get("yes"):
            return
        stdin = self._stdin
        if not (hasattr(stdin, "isatty") and stdin.isatty()):
            raise NotConfirmed(
                f"{question} Refusing without --yes because stdin is not a terminal; nothing was changed."
            )
        self.stderr.write(f"{question} Type 'yes' to continue: ", ending="")
        self.stderr.flush()
        answer = stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            raise NotConfirmed("Not confirmed; nothing was changed.")
