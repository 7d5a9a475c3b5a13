"""Render every panel of zeroloss-dashboard.json from a real run, as a PNG (docs/img/grafana-panels.png).

    python docs/grafana/render_panels.py [OUT.png]   (from the repository root, in the dev environment)

Grafana cannot be installed where zeroloss is built, so this is the second best, and says so on
the image: the same real run as check_queries.py (a real ``zeroloss_worker``, ``runserver`` and
Prometheus), longer, then each panel's queries asked of Prometheus over the run
(``/api/v1/query_range``) and drawn at the dashboard's grid positions, as lines for a
timeseries panel and as the last value for a stat panel, by headless Chromium. Needs
``prometheus`` and ``chromium`` on the PATH (Debian packages of those names).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from check_queries import DASHBOARD, ROOT, get, real_run

WIDTH = 1600
ROW = 30  # pixels per grid unit of height, Grafana's
COLOURS = ("#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#fade2a")


def series_of(prometheus: str, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode(
        {"query": expr.replace("$__rate_interval", "1m"), "start": start, "end": end, "step": 2}
    )
    answer = json.loads(get(f"{prometheus}/api/v1/query_range?{query}"))
    if answer.get("status") != "success":
        raise RuntimeError(f"{expr}: {answer}")
    return list(answer["data"]["result"])


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip() or "value"


def shown(value: float, unit: str) -> str:
    if unit == "percentunit":
        return f"{value * 100:.1f}%"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.1f} s"
    text = f"{value:.3g}"
    return f"{text}/s" if unit == "ops" else text


def chart(
    lines: list[tuple[str, list[tuple[float, float]]]], unit: str, w: int, h: int, span: tuple[float, float]
) -> str:
    left, top, right, bottom = 56, 8, 8, 22
    values = [v for _, points in lines for _, v in points] or [0.0]
    high = max(values) * 1.1 or 1.0
    t0, t1 = span

    def x(t: float) -> float:
        return left + (t - t0) / (t1 - t0) * (w - left - right)

    def y(v: float) -> float:
        return top + (1 - v / high) * (h - top - bottom)

    parts = [f'<svg width="{w}" height="{h}">']
    for frac in (0, 0.5, 1):
        v = high * frac
        parts.append(
            f'<line x1="{left}" x2="{w - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#2c3038"/>'
            f'<text x="{left - 4}" y="{y(v) + 4:.1f}" text-anchor="end">{html.escape(shown(v, unit))}</text>'
        )
    for frac in (0, 0.5, 1):
        t = t0 + (t1 - t0) * frac
        parts.append(
            f'<text x="{x(t):.1f}" y="{h - 6}" text-anchor="{("start", "middle", "end")[int(frac * 2)]}">{time.strftime("%H:%M:%S", time.gmtime(t))}</text>'
        )
    for i, (_, points) in enumerate(lines):
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in points)
        parts.append(
            f'<polyline fill="none" stroke="{COLOURS[i % len(COLOURS)]}" stroke-width="1.5" points="{path}"/>'
        )
    parts.append("</svg>")
    return "".join(parts)


def page(prometheus: str, start: float, end: float) -> tuple[str, int]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    cells = []
    for panel in panels:
        grid, unit = panel["gridPos"], panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        w, h = int(grid["w"] * WIDTH / 24) - 8, grid["h"] * ROW - 8
        lines: list[tuple[str, list[tuple[float, float]]]] = []
        for target in panel["targets"]:
            for s in series_of(prometheus, target["expr"], start, end):
                points = [(float(t), float(v)) for t, v in s["values"] if v not in ("NaN", "+Inf", "-Inf")]
                if points:
                    lines.append((legend(target.get("legendFormat", ""), s["metric"]), points))
        if panel["type"] == "stat":
            body = (
                "".join(
                    f'<div class="stat" style="color:{COLOURS[i % len(COLOURS)]}">{html.escape(shown(points[-1][1], unit))}'
                    f"<small>{html.escape(name)}</small></div>"
                    for i, (name, points) in enumerate(lines)
                )
                or '<div class="none">no data</div>'
            )
        elif lines:
            body = chart(lines, unit, w - 16, h - 60, (start, end)) + "".join(
                f'<span class="key"><i style="background:{COLOURS[i % len(COLOURS)]}"></i>{html.escape(name)}</span>'
                for i, (name, _) in enumerate(lines)
            )
        else:
            body = '<div class="none">no data (this run causes no such event)</div>'
        cells.append(
            f'<div class="panel" style="left:{int(grid["x"] * WIDTH / 24)}px;top:{grid["y"] * ROW + 44}px;'
            f'width:{w}px;height:{h}px"><h2>{html.escape(panel["title"])}</h2>{body}</div>'
        )
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels) * ROW + 52
    note = (
        "zeroloss dashboard: every panel of docs/grafana/zeroloss-dashboard.json, its queries asked of a real "
        "Prometheus scraping a real worker and ledger; drawn by docs/grafana/render_panels.py, not by Grafana"
    )
    return (
        "<!doctype html><meta charset=utf-8><style>"
        "body{margin:0;background:#111217;color:#ccccdc;font:12px sans-serif;position:relative;"
        f"width:{WIDTH}px;height:{bottom}px}}"
        "header{padding:12px 8px;font-size:14px}"
        ".panel{position:absolute;background:#181b1f;border:1px solid #2c3038;border-radius:2px;padding:0 8px;box-sizing:border-box}"
        "h2{font-size:13px;font-weight:500;margin:8px 0}"
        "svg text{fill:#8e8e8e;font-size:10px}"
        ".key{margin-right:12px;white-space:nowrap}.key i{display:inline-block;width:12px;height:3px;margin-right:4px;vertical-align:middle}"
        ".stat{display:inline-block;font-size:40px;margin:16px 24px 0 0}.stat small{display:block;font-size:12px;color:#ccccdc}"
        ".none{color:#8e8e8e;margin-top:40px;text-align:center}"
        f"</style><header>{html.escape(note)}</header>{''.join(cells)}"
    ), bottom


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs" / "img" / "grafana-panels.png").resolve()
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if shutil.which("prometheus") is None or browser is None:
        print(
            "render_panels.py needs prometheus and chromium on the PATH (apt-get install prometheus chromium)",
            file=sys.stderr,
        )
        return 2
    start = time.time()
    with real_run(rounds=90, pause=1.0) as prometheus:
        document, height = page(prometheus, start, time.time())
    with tempfile.TemporaryDirectory(prefix="zl-dashboard-") as scratch:
        source = Path(scratch) / "dashboard.html"
        source.write_text(document)
        subprocess.run(
            [
                browser,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--window-size={WIDTH},{height}",
                f"--screenshot={out}",
                source.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
