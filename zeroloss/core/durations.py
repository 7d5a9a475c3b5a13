"""Durations as text: the one format for terminals, the admin and messages (no imports: any
module may use it)."""

from __future__ import annotations

import re

#: A duration as commands and settings write it: a number and a unit (``90s``, ``15m``, ``2h``, ``7d``).
DURATION_TEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration_text(text: str) -> float | None:
    """``"7d"`` -> 604800.0; None when ``text`` is not a duration."""
    match = DURATION_TEXT.match(text)
    return None if match is None else float(match.group(1)) * UNITS[match.group(2)]


def format_duration(seconds: float | None) -> str:
    """Seconds as text for terminals and the admin: ``-``, ``4.2s``, ``42s``, ``12m 05s``,
    ``3h 07m``, ``2d 04h``; negative durations get a leading ``-``. The one text format."""
    if seconds is None:
        return "-"
    magnitude = abs(float(seconds))
    s = int(magnitude)
    if s < 60:
        text = f"{magnitude:.1f}s" if magnitude < 10 else f"{s}s"
    elif s < 3600:
        text = f"{s // 60}m {s % 60:02d}s"
    elif s < 86400:
        text = f"{s // 3600}h {s % 3600 // 60:02d}m"
    else:
        text = f"{s // 86400}d {s % 86400 // 3600:02d}h"
    return f"-{text}" if seconds < 0 and text != "0.0s" else text
