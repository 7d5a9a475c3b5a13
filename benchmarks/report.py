"""Figures, targets and the one table the suite prints."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Target:
    """A target. ``kind``: ``min``/``max`` on the median; ``ratio``/``ratio_max``: the ratio to the
    ``ratio_to`` figure at least/at most ``value``; ``within``: relative change against
    ``ratio_to`` at most ``value``."""

    text: str
    kind: str = ""
    value: float = 0.0
    also_ratio_min: float | None = None


@dataclass
class Figure:
    key: str
    label: str
    unit: str
    values: list[float] = field(default_factory=list)
    higher_is_better: bool = True
    ratio_to: str | None = None  # key of the figure this one is compared with
    ratio_label: str = "raw"
    #: Reference values measured in runs alternating with this figure's (the ratio's denominator).
    baseline: list[float] = field(default_factory=list)
    target: Target | None = None
    checks: dict[str, bool] = field(default_factory=dict)  # correctness checks (exactly once, ...)
    info: dict[str, Any] = field(default_factory=dict)
    ratio: float | None = None
    met: bool | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")


def evaluate(figures: dict[str, Figure]) -> None:
    for fig in figures.values():
        other = figures.get(fig.ratio_to or "")
        if other is not None and other.values and fig.values and other.median:
            fig.ratio = fig.median / other.median
        if fig.baseline and fig.values:
            fig.ratio = fig.median / statistics.median(fig.baseline)
        if not fig.values:
            fig.met = None
            continue
        met: bool | None = None
        t = fig.target
        if t is not None and t.kind:
            if t.kind == "min":
                met = fig.median >= t.value
                if t.also_ratio_min is not None:
                    met = met and fig.ratio is not None and fig.ratio >= t.also_ratio_min
            elif t.kind == "max":
                met = fig.median <= t.value
            elif t.kind == "within":
                if fig.ratio is not None:
                    change = (1 / fig.ratio - 1) if fig.higher_is_better else (fig.ratio - 1)
                    met = change <= t.value
            elif t.kind == "ratio":
                met = fig.ratio is not None and fig.ratio >= t.value
            elif t.kind == "ratio_max":
                met = fig.ratio is not None and fig.ratio <= t.value
            elif t.kind == "checks":
                met = True
        if fig.checks and (t is not None or not all(fig.checks.values())):
            met = (met is not False) and all(fig.checks.values())
        fig.met = met


def _num(value: float, unit: str) -> str:
    if value != value:  # NaN
        return "-"
    if unit in ("msg/s", "tps", "cycles/s"):
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def table(figures: dict[str, Figure]) -> str:
    headers = ["workload", "median", "min-max", "unit", "ratio", "target", "met"]
    rows: list[list[str]] = []
    for fig in figures.values():
        rng = f"{_num(min(fig.values), fig.unit)}-{_num(max(fig.values), fig.unit)}" if fig.values else "-"
        ratio = f"{fig.ratio:.2f}x {fig.ratio_label}" if fig.ratio is not None else ""
        met = {True: "yes", False: "NO", None: ""}[fig.met]
        failed = [name for name, ok in fig.checks.items() if not ok]
        if failed:
            met += f" ({', '.join(failed)} failed)"
        rows.append(
            [
                fig.label,
                _num(fig.median, fig.unit),
                rng,
                fig.unit,
                ratio,
                fig.target.text if fig.target else "",
                met,
            ]
        )
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    right = {1, 2}
    out = []
    for n, row in enumerate([headers, *rows]):
        cells = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        out.append("| " + " | ".join(cells) + " |")
        if n == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def save_json(path: Path, machine: dict[str, Any], args: dict[str, Any], figures: dict[str, Figure]) -> None:
    data = {
        "machine": machine,
        "args": args,
        "figures": [{**asdict(f), "median": f.median if f.values else None} for f in figures.values()],
    }
    path.write_text(json.dumps(data, indent=2, default=str))
