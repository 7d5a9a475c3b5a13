"""Hot-path profiles with py-spy (a dev-only tool: ``pip install py-spy``).

``python -m benchmarks --profile DIR`` samples (1) this process persisting messages one per
transaction and (2) a ``zeroloss_worker`` process draining no-op messages, writes the
collapsed stacks to ``DIR`` and prints the top frames by own time and by total time.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

_LINE = re.compile(r":\d+\)$")


def available() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return found if Path(found).exists() else None


def record(pid: int, out: Path, work: Callable[[], None], rate: int = 250) -> None:
    exe = available()
    if exe is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy)")
    spy = subprocess.Popen(
        [
            exe,
            "record",
            "--pid",
            str(pid),
            "--rate",
            str(rate),
            "--format",
            "raw",
            "--output",
            str(out),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(1.0)  # let py-spy attach
    try:
        work()
    finally:
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(timeout=60)
        except subprocess.TimeoutExpired:
            spy.kill()


def _frame(raw: str) -> str:
    return _LINE.sub(")", raw.strip())


def top_frames(collapsed: Path, n: int = 15, skip: tuple[str, ...] = ()) -> str:
    """Own and total time per function from py-spy's collapsed stacks, as two short tables."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";")]
        if any(s in stack for s in skip):
            continue
        weight = int(count)
        samples += weight
        own[frames[-1]] += weight
        for f in set(frames):
            total[f] += weight
    if not samples:
        return "(no samples)"
    lines = [f"{samples} samples (active threads only)", "own time:"]
    lines += [f"  {100 * c / samples:5.1f}%  {f}" for f, c in own.most_common(n)]
    lines.append("total time (function and what it calls):")
    lines += [f"  {100 * c / samples:5.1f}%  {f}" for f, c in total.most_common(n + 10)]
    return "\n".join(lines)
