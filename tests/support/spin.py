"""Running a Promela model's checks with spin (tests/model/*.pml): one verifier generated and
compiled per number of workers, every configuration and mutant chosen when it starts (``ZL_*``
environment variables read by the model's ``init``), so a check costs no compile.

Used by tests/process/test_lease_model.py and tests/process/test_workflow_model.py; what each
model proves is in docs/guarantees.md ("What the model checker proves").
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.support.debian import ensure_debian_package

#: The property a liveness check violates when spin finds a run that never gets there.
ACCEPTANCE_CYCLE = "acceptance cycle"


@dataclass(frozen=True)
class Check:
    name: str
    workers: int
    env: dict[str, str]
    #: Liveness (``-a -f``, the model's LTL formula for it) rather than the safety assertions.
    liveness: bool = False
    #: For a mutant: what spin must report (a fragment of the violated assertion, or
    #: "acceptance cycle"); None for the real protocol (no error, complete search).
    finds: str | None = None
    #: A mutant whose safety violation would hide its liveness one: assertions ignored.
    ignore_asserts: bool = False


@dataclass
class Outcome:
    check: Check
    output: str
    seconds: float

    @property
    def errors(self) -> int:
        found = re.search(r"errors: (\d+)", self.output)
        assert found, f"{self.check.name}: no verdict in spin's output:\n{self.output[-3000:]}"
        return int(found.group(1))

    @property
    def states(self) -> int:
        found = re.search(r"(\d+) states, stored", self.output)
        return int(found.group(1)) if found else 0

    @property
    def complete(self) -> bool:
        return "Search not completed" not in self.output and "max search depth too small" not in self.output


def run(cmd: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        cmd,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )
    assert done.returncode == 0, f"`{' '.join(cmd)}` failed ({done.returncode}):\n{done.stderr[-3000:]}"
    return done.stdout


def verifier(model: Path, directory: Path, defines: Sequence[str]) -> Path:
    """spin's verifier of ``model``, generated with ``defines`` and compiled in ``directory``."""
    directory.mkdir()
    shutil.copy(model, directory / model.name)
    run(["spin", *defines, "-a", model.name], directory, timeout=60)
    # NFAIR: the weak-fairness check's process budget (five processes at most run).
    run(["gcc", "-O2", "-DNFAIR=3", "-o", "pan", "pan.c"], directory, timeout=300)
    return directory / "pan"


def check(pan: Path, check: Check, *, liveness_claim: str, timeout: float = 120) -> Outcome:
    args = [str(pan), "-w22", "-m10000"]
    if check.liveness:
        args += ["-a", "-f", "-N", liveness_claim]
    else:
        args += ["-N", "safety"]
    if check.ignore_asserts:
        args.append("-A")
    started = time.monotonic()
    # pan exits 0 whether or not it found an error; the verdict is in its output. Its trail
    # file (when it found one) is written next to it.
    output = run(args, pan.parent, timeout=timeout, env=check.env)
    return Outcome(check, output, time.monotonic() - started)


def run_checks(
    model: Path, checks: Sequence[Check], root: Path, *, liveness_claim: str, title: str
) -> dict[str, Outcome]:
    """Every check of ``model``, two at a time (one verifier per number of workers, ``-DW=``),
    with a table of their sizes and verdicts on stdout (``pytest -s`` shows it)."""
    ensure_debian_package("spin", ["spin"])
    ensure_debian_package("gcc", ["gcc"])  # compiles spin's verifier
    parallel = min(2, os.cpu_count() or 1)
    with ThreadPoolExecutor(parallel) as pool:
        sizes = sorted({c.workers for c in checks})
        pans = dict(
            zip(sizes, pool.map(lambda w: verifier(model, root / f"w{w}", [f"-DW={w}"]), sizes), strict=True)
        )
        done = list(pool.map(lambda c: check(pans[c.workers], c, liveness_claim=liveness_claim), checks))
    print(f"\n{title} (spin):")
    for o in done:
        verdict = f"errors: {o.errors}" + ("" if o.complete else " (search stopped at the error)")
        print(f"  {o.check.name:32} {o.states:>9,} states  {o.seconds:5.1f}s  {verdict}")
    return {o.check.name: o for o in done}
