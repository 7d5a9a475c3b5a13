"""The exit codes every zeroloss command shares (see :mod:`zeroloss.management.base`), and the
exceptions that carry them. Import them from :mod:`zeroloss.management.base`."""

from __future__ import annotations

from django.core.management.base import CommandError

EXIT_OK = 0
EXIT_WARNING = 1
EXIT_USAGE = 2
EXIT_CRITICAL = 2
EXIT_NOT_CONFIRMED = 3
EXIT_UNREACHABLE = 4
EXIT_BROKEN_PIPE = 128 + 13  # SIGPIPE


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


class LedgerUnreachable(CommandExit):
    """The database could not be reached or failed a statement (exit code 4)."""

    code = EXIT_UNREACHABLE
