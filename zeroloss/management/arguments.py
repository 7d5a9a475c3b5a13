"""How zeroloss commands read their arguments: durations, counts, bad input as exit code 2, and
every option's help ending with its default. Import them from :mod:`zeroloss.management.base`."""

from __future__ import annotations

import argparse
import math
from typing import NoReturn

from django.core.management.base import CommandError, CommandParser, DjangoHelpFormatter
from django.utils.translation import gettext as _
from django.utils.translation import pgettext

from ..core.durations import DURATION_TEXT as _DURATION_RE
from ..core.durations import UNITS as _UNITS
from .exits import EXIT_USAGE

#: The longest duration a command accepts: 1,000 years, far beyond any retention, and small
#: enough that "now minus it" is a date both Python and the database can represent.
MAX_DURATION_DAYS = 365_000


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``2h``, ``7d`` -> seconds. Raises ``argparse.ArgumentTypeError``."""
    match = _DURATION_RE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(
            _("invalid duration %(text)s: use a number and a unit, like 90s, 15m, 2h, 7d")
            % {"text": repr(text)}
        )
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if not seconds <= MAX_DURATION_DAYS * 86400:  # also rejects inf, from a very long number
        raise argparse.ArgumentTypeError(
            _("invalid duration %(text)s: at most %(days)sd (1,000 years)")
            % {"text": repr(text), "days": MAX_DURATION_DAYS}
        )
    return seconds


#: The largest count a command takes (the database's 32-bit integers).
MAX_COUNT = 2**31 - 1


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            _("invalid number %(text)s: expected a whole number >= 1") % {"text": repr(text)}
        ) from None
    if not 1 <= value <= MAX_COUNT:
        raise argparse.ArgumentTypeError(
            _("invalid number %(text)s: expected a whole number from 1 to %(max)s")
            % {"text": repr(text), "max": MAX_COUNT}
        )
    return value


def positive_float(text: str) -> float:
    """Seconds > 0 and finite: ``inf`` and ``nan`` are refused (a wait must end)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            _("invalid number %(text)s: expected seconds > 0") % {"text": repr(text)}
        ) from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(
            _("invalid number %(text)s: expected finite seconds > 0") % {"text": repr(text)}
        )
    return value


class UsageError(CommandError):
    """Bad arguments from ``call_command`` (exit code 2); the command line gets argparse's output."""

    def __init__(self, message: str) -> None:
        super().__init__(_("Error: %(message)s") % {"message": message}, returncode=EXIT_USAGE)


class ZeroLossParser(CommandParser):
    """Django's parser, but bad arguments are exit code 2 from ``call_command`` too."""

    def error(self, message: str) -> NoReturn:
        if self.called_from_command_line:
            super().error(message)  # usage + "error: ..." on stderr, exit code 2
        raise UsageError(message)


class DefaultsHelpFormatter(DjangoHelpFormatter):
    """Django's help layout, every option's help ending with its default (unless it says it)."""

    #: Django's options whose ``None`` default means "from the environment": nothing to show.
    _FROM_ENVIRONMENT = frozenset({"settings", "pythonpath"})

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        # A help text that states its default itself, in English or in the active language.
        says_default = "default" in (text or "").lower() or _says_default(text or "")
        if not text or text == argparse.SUPPRESS or not action.option_strings or says_default:
            return text
        if action.required:
            return _("%(help)s (required)") % {"help": text.rstrip()}
        if action.nargs == 0:  # a flag: store_true, store_const, version, help
            if action.dest in ("help", "version"):
                return text
            shown = (
                pgettext("an option's default: a flag", "on")
                if action.default
                else pgettext("an option's default: a flag", "off")
            )
        elif action.default in (None, "") or action.default == argparse.SUPPRESS:
            if action.dest in self._FROM_ENVIRONMENT:
                return text
            shown = pgettext("an option's default: no value", "none")
        else:
            shown = "%(default)s"
        # argparse fills %(default)s in afterwards; a literal % in ``shown`` cannot occur.
        return _("%(help)s (default: %(shown)s)") % {"help": text.rstrip(), "shown": shown}


def _says_default(text: str) -> bool:
    """Whether ``text`` names its default in the active language ("default" in the catalog)."""
    word = pgettext("the word an option's help uses to state its default", "default").lower()
    return word in text.lower()
