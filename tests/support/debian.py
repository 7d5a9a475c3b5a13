"""Debian packages the tests drive, installed by the test that needs one when it is missing.

``make test`` on a fresh machine needs nothing installed by hand: Chromium (the browser tests),
``pg_autoctl`` (failover), PgBouncer, libfaketime, spin (the lease model), iproute2 (the fault
suite's network namespaces) and libfuse2 (its stalling disk) each come from Debian through :func:`ensure_debian_package`, bounded
in time. ``.ci/run`` preinstalls them only to keep apt out of its timed test runs; the suite
never depends on that. A package that cannot be installed (no root, no apt-get, no network) is
a :class:`DebianPackageError` whose message names the package to install: a failure, never a
skip.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

#: Serialises installs across the test processes of one machine: dpkg has its own lock, but a
#: second concurrent ``apt-get install`` fails on it instead of waiting for the first.
APT_LOCK = Path("/tmp/zeroloss-apt.lock")


class DebianPackageError(RuntimeError):
    """A needed package is missing and could not be installed; the message says how to fix it."""


def missing_paths(present: Sequence[Path | str]) -> list[str]:
    """The entries of ``present`` that neither exist as a path nor are a command on the PATH."""
    return [str(p) for p in present if not (Path(p).exists() or shutil.which(str(p)))]


def ensure_debian_package(
    package: str, present: Sequence[Path | str] | None = None, *, timeout: float = 600
) -> None:
    """Install Debian's ``package`` with apt-get unless everything in ``present`` (paths or
    commands; default: a command named like the package) is there already.

    Bounded by ``timeout`` seconds in all (``apt-get update`` and the install). Raises
    :class:`DebianPackageError` when it cannot install (not root, no apt-get, apt failed or
    timed out) or the install did not provide ``present``.
    """
    wanted: Sequence[Path | str] = [package] if present is None else present
    if not missing_paths(wanted):
        return
    hint = f"install it by hand: apt-get install {package}"
    if os.geteuid() != 0:
        raise DebianPackageError(
            f"{', '.join(missing_paths(wanted))} not found and installing {package} needs root; {hint}"
        )
    if shutil.which("apt-get") is None:
        raise DebianPackageError(
            f"{', '.join(missing_paths(wanted))} not found and there is no apt-get; {hint}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    deadline = time.monotonic() + timeout
    with open(APT_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not missing_paths(wanted):  # another test process installed it while we waited
            return
        for cmd in (
            ["apt-get", "update", "-qq"],
            # dpkg's own lock may be held by an install outside the suite (.ci/run's): wait for it
            ["apt-get", "install", "-y", "-qq", "-o", f"DPkg::Lock::Timeout={int(timeout)}", package],
        ):
            left = max(1.0, deadline - time.monotonic())
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=left, env=env)
            except subprocess.TimeoutExpired as exc:
                raise DebianPackageError(f"`{' '.join(cmd)}` did not finish in {left:.0f}s; {hint}") from exc
            if done.returncode != 0:
                raise DebianPackageError(
                    f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()[-2000:]}; {hint}"
                )
    if missing_paths(wanted):
        raise DebianPackageError(
            f"installed {package} but {', '.join(missing_paths(wanted))} is still missing"
        )
