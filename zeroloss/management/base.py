"""Conventions shared by every zeroloss command.

- results on stdout (a table by default, ``--json`` for scripts), logs and prompts on stderr;
- ``--database ALIAS``;
- ``--verbosity``: 0 results and errors only (no progress bar, no informational lines),
  1 the default, 2 more detail (what each command adds is in docs/operations.md);
- exit codes, the same meaning in every command (each documents which it uses):

  ====  ==========================================================================
  0     success
  1     a warning condition (``zeroloss_verify``), the replication requirement is not
        met (``zeroloss_nodes``), or some selected messages were not changed
        (``zeroloss_requeue``)
  2     bad arguments (argparse style: usage and ``error:`` on stderr, nothing changed),
        or a critical condition (``zeroloss_verify``)
  3     not confirmed: the prompt was refused, or stdin is not a terminal and ``--yes``
        was not given; nothing changed
  4     the ledger could not be reached: the database refused or dropped the connection,
        or failed a statement (``OperationalError``/``InterfaceError``: server down, lost
        connection, lock or statement timeout). One line on stderr; with ``--json``, a
        one-line ``{"status": "error", ...}`` document on stdout. A command that changes
        data may have committed the batches before the failure: run it again
  141   stdout was closed by its reader (``| head``): stopped quietly, as a tool killed by
        SIGPIPE would be (128 + 13)
  ====  ==========================================================================

- durations written ``90s``, ``15m``, ``2h``, ``7d`` (at most :data:`MAX_DURATION_DAYS` days);
- commands that change data take ``--dry-run`` (change nothing, report what would change)
  and ``--yes`` (skip the confirmation prompt for many rows or a set-based selection), also
  spelled ``--no-input``/``--noinput`` as Django's commands do (``call_command(...,
  interactive=False)`` too);
- every option's ``--help`` ends with its default;
- a progress bar on long work, only when stdout is a terminal, ``--json`` is off and
  ``--verbosity`` is at least 1.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from django.core.management.base import (
    BaseCommand,
    CommandParser,
    OutputWrapper,
)
from django.db import DEFAULT_DB_ALIAS, InterfaceError, OperationalError, connections
from django.utils.translation import gettext as _
from django.utils.translation import pgettext

from ..exceptions import InvalidMessage
from ..ledger.models import Message
from ..ledger.service import ZeroLossMessageService, default_instance_id
from ..ledger.validation import validate_queue_name
from .arguments import (
    MAX_COUNT,
    MAX_DURATION_DAYS,
    DefaultsHelpFormatter,
    UsageError,
    ZeroLossParser,
    parse_duration,
    positive_float,
    positive_int,
)
from .exits import (
    EXIT_BROKEN_PIPE,
    EXIT_CRITICAL,
    EXIT_NOT_CONFIRMED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    EXIT_WARNING,
    CommandExit,
    CriticalFound,
    Incomplete,
    LedgerUnreachable,
    NotConfirmed,
    WarningFound,
)

#: Above this many rows an explicit ID list asks for confirmation (set-based selections always do).
CONFIRM_THRESHOLD = 100


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
    #: ``call_command(..., interactive=False)``, as Django's own commands take it, is ``--yes``.
    stealth_options = ("stdin", "interactive")
    #: ``--verbosity`` of the running command (set by :meth:`execute`).
    verbosity = 1

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        # Django builds a CommandParser with its own options and the command's arguments; a
        # ZeroLossParser adopts all of them through argparse's ``parents`` (the parent must
        # leave -h/--help to the child), so bad arguments are exit code 2 from call_command too.
        base = super().create_parser(prog_name, subcommand, **{**kwargs, "add_help": False})
        parser = ZeroLossParser(
            prog=base.prog,
            # ``help`` is marked with gettext_noop and translated here, as the parser is built:
            # argparse runs re.sub over it, which a lazy translation would break.
            description=_(self.help) if self.help else base.description,
            formatter_class=DefaultsHelpFormatter,
            parents=[base],
            missing_args_message=base.missing_args_message,
            called_from_command_line=base.called_from_command_line,
            add_help=kwargs.get("add_help", True),
        )
        parser.add_argument("--database", default="default", help=_("Database alias (default: %(default)s)."))
        if self.json_option:
            parser.add_argument(
                "--json", action="store_true", help=_("Print machine-readable JSON on stdout.")
            )
        if self.changes_data:
            parser.add_argument(
                "--dry-run", action="store_true", help=_("Report what would change and change nothing.")
            )
            parser.add_argument(
                "--yes",
                "-y",
                "--no-input",
                "--noinput",
                action="store_true",
                dest="yes",
                help=_("Do not ask for confirmation (for scripts)."),
            )
        self._parser = parser
        return parser

    def run_from_argv(self, argv: list[str]) -> None:
        try:
            super().run_from_argv(argv)
        except BrokenPipeError:
            # The reader went away (``| head -1``): stop quietly, as a Unix tool killed by SIGPIPE
            # does. stdout now points at /dev/null so the interpreter's last flush cannot fail too.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(EXIT_BROKEN_PIPE)

    def execute(self, *args: Any, **options: Any) -> Any:
        self._stdin = options.get("stdin") or sys.stdin
        self.verbosity = int(options.get("verbosity", 1))
        try:
            return super().execute(*args, **options)
        except (OperationalError, InterfaceError) as exc:
            raise self.unreachable(exc, options) from exc

    def unreachable(self, exc: Exception, options: dict[str, Any]) -> LedgerUnreachable:
        """Exit code 4, one line on stderr (and a one-line JSON document with ``--json``)."""
        alias = options.get("database") or DEFAULT_DB_ALIAS
        detail = " ".join(str(exc).split()) or "no detail"
        english = f"could not reach the ledger (database {alias!r}): {type(exc).__name__}: {detail}"
        message = _("could not reach the ledger (database %(alias)s): %(error)s: %(detail)s") % {
            "alias": repr(alias),
            "error": type(exc).__name__,
            "detail": " ".join(str(exc).split()) or _("no detail"),
        }
        if options.get("json"):
            document = {
                "status": "error",
                "error": english,  # machine-readable: English, whatever the language
                "error_type": type(exc).__name__,
                "command": self.command_name(),
                "database": alias,
                "exit_code": EXIT_UNREACHABLE,
            }
            # One line, so ``--watch --json`` readers that parse line by line get it too.
            self.stdout.write(json.dumps(document, sort_keys=True))
        return LedgerUnreachable(message)

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
                _("unknown database alias %(alias)s; configured: %(configured)s")
                % {"alias": repr(alias), "configured": ", ".join(connections.databases)}
            )
        return ZeroLossMessageService(using=alias, instance_id=f"cli:{self.command_name()}")

    def actor(self) -> str:
        """A unique actor name for this run, recorded in the audit trail and purge records."""
        return f"cli:{self.command_name()}@{default_instance_id()}"

    def check_queue(self, service: ZeroLossMessageService, queue: str | None) -> str | None:
        """``queue`` if the ledger has messages in it; otherwise a usage error (exit code 2)."""
        if queue is None:
            return None
        try:
            validate_queue_name(queue)
        except InvalidMessage as exc:
            self.usage_error(str(exc))
        messages = Message.objects.using(service.using)
        if not messages.filter(queue_name=queue).exists():
            known = list(messages.values_list("queue_name", flat=True).distinct().order_by("queue_name")[:21])
            listed = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
            self.usage_error(
                (
                    _("unknown queue %(queue)s: the ledger has no message in it (queues: %(queues)s)")
                    if known
                    else _("unknown queue %(queue)s: the ledger has no message in it (the ledger is empty)")
                )
                % {"queue": repr(queue), "queues": listed}
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

    def log(self, message: str, level: int = 1) -> None:
        """An informational line on stderr, shown from ``--verbosity level`` up."""
        if self.verbosity >= level:
            self.stderr.write(message)

    def progress(self, total: int, label: str, options: dict[str, Any]) -> Progress:
        """A progress bar on stdout when it is a terminal (never with ``--json`` or ``-v 0``)."""
        enabled = self.stdout.isatty() and not options.get("json") and self.verbosity >= 1
        return Progress(self.stdout, total, label, enabled=enabled)

    # -- confirmation -------------------------------------------------------------------

    def confirm(self, question: str, options: dict[str, Any]) -> None:
        """Ask ``question`` on the terminal unless ``--yes``; raise :class:`NotConfirmed` if refused.

        When stdin is not a terminal (cron, CI, a pipe) and ``--yes`` was not given, nothing
        is asked and the command stops, having changed nothing.
        """
        if options.get("yes") or options.get("interactive") is False:
            return
        stdin = self._stdin
        if not (hasattr(stdin, "isatty") and stdin.isatty()):
            raise NotConfirmed(
                _("%(question)s Refusing without --yes because stdin is not a terminal; nothing was changed.")
                % {"question": question}
            )
        prompt = _("%(question)s Type 'yes' to continue: ") % {"question": question}
        self.stderr.write(prompt, ending="")
        self.stderr.flush()
        answer = stdin.readline().strip().lower()
        # "yes" in the active language is accepted too (the prompt asks for it).
        if answer not in ("y", "yes", pgettext("the answer that confirms a prompt", "yes").lower()):
            raise NotConfirmed(_("Not confirmed; nothing was changed."))


__all__ = [
    "CONFIRM_THRESHOLD",
    "EXIT_BROKEN_PIPE",
    "EXIT_CRITICAL",
    "EXIT_NOT_CONFIRMED",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "EXIT_WARNING",
    "MAX_COUNT",
    "MAX_DURATION_DAYS",
    "CommandExit",
    "CriticalFound",
    "DefaultsHelpFormatter",
    "Incomplete",
    "LedgerUnreachable",
    "NotConfirmed",
    "Progress",
    "UsageError",
    "WarningFound",
    "ZeroLossCommand",
    "ZeroLossParser",
    "parse_duration",
    "positive_float",
    "positive_int",
]
