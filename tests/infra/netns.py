"""Linux network namespaces joined by veth pairs: partitions and dead hosts on one machine.

:class:`NetnsLab` creates, for one test run, a "database host" namespace (``zl-<pid>-db``) and
any number of "worker host" namespaces (``zl-<pid>-w1``, ...), each joined to the database host
by its own veth pair addressed from a private /30 (``10.231.<n>.1`` on the database side,
``10.231.<n>.2`` on the worker side). Those addresses exist only inside the namespaces made
here; nothing in the root namespace is addressed or routed, so nothing else on the machine
can see or reach them. ``lo`` is up in every namespace.

- :meth:`Link.cut` takes the worker end of a pair down: the worker host loses its only
  route, the database end loses its carrier and silently drops what it sends (no RST, no
  ICMP reaches anyone) — a partition as a switch failure makes one;
- :meth:`Link.heal` brings it up again (the route comes back with the address);
- :meth:`NetnsLab.kill_host` SIGKILLs every process inside a worker namespace (``ip netns
  pids``) and deletes the namespace: with its link down first, the FIN its kernel sends for
  the dying sockets is lost, and the database host never hears that the peer is gone;
- :meth:`NetnsLab.destroy` kills every process in every namespace of the run and deletes
  them (also at interpreter exit, whatever happened).

Root is needed (``ip netns add``); iproute2 is installed from Debian when ``ip`` is missing.
Every command is bounded in time and a failure is a :class:`NetnsError` saying what failed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

from tests.support.waiting import wait_until

#: The private range the veth pairs are addressed from (/30 each: 10.231.<n>.0/30).
SUBNET_PREFIX = "10.231"
COMMAND_TIMEOUT = 30


class NetnsError(RuntimeError):
    """A namespace or link could not be set up or taken down; the message says which command."""


def ip_binary() -> str:
    """``ip`` (iproute2); installed from Debian, bounded in time, when it is missing."""
    from tests.support.debian import DebianPackageError, ensure_debian_package

    if os.geteuid() != 0:
        raise NetnsError("network namespaces need root (ip netns add); run the fault suite as root")
    try:
        ensure_debian_package("iproute2", ["ip"], timeout=300)
    except DebianPackageError as exc:
        raise NetnsError(f"`ip` is missing: {exc}") from exc
    found = shutil.which("ip")
    assert found  # ensure_debian_package checked it
    return found


def _ip(*args: str) -> str:
    cmd = [ip_binary(), *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise NetnsError(f"{' '.join(cmd)} did not finish in {COMMAND_TIMEOUT}s") from exc
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass
class Link:
    """One veth pair: ``db_if`` in the database namespace, ``worker_if`` in ``worker_ns``."""

    index: int
    worker_ns: str
    db_ns: str
    db_if: str
    worker_if: str
    up: bool = True

    @property
    def db_address(self) -> str:
        return f"{SUBNET_PREFIX}.{self.index}.1"

    @property
    def worker_address(self) -> str:
        return f"{SUBNET_PREFIX}.{self.index}.2"

    def cut(self) -> float:
        """Take the worker end down (silent loss both ways); returns when (``time.time()``)."""
        _ip("-n", self.worker_ns, "link", "set", self.worker_if, "down")
        self.up = False
        return time.time()

    def heal(self) -> float:
        """Bring the worker end up again; returns when (``time.time()``)."""
        _ip("-n", self.worker_ns, "link", "set", self.worker_if, "up")
        self.up = True
        return time.time()


class NetnsLab:
    """The namespaces of one test run; :meth:`destroy` (or interpreter exit) removes them all."""

    def __init__(self, tag: str = "") -> None:
        if os.geteuid() != 0:
            raise NetnsError("network namespaces need root (ip netns add); run the fault suite as root")
        self.prefix = f"zl-{os.getpid()}{tag}"
        self.db_ns = f"{self.prefix}-db"
        self.links: dict[str, Link] = {}
        self._namespaces: list[str] = []
        atexit.register(self.destroy)
        self._add_namespace(self.db_ns)

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def exec_prefix(self, namespace: str) -> list[str]:
        """The command prefix that runs a program inside ``namespace``."""
        return [ip_binary(), "netns", "exec", namespace]

    def add_worker_host(self) -> Link:
        """A new worker namespace joined to the database namespace by its own veth pair."""
        index = len(self.links) + 1
        if index > 255:
            raise NetnsError("at most 255 worker namespaces per run (one /30 of 10.231.<n>.0 each)")
        worker_ns = f"{self.prefix}-w{index}"
        self._add_namespace(worker_ns)
        # Interface names are limited to 15 characters: zl<pid><tag>d<n> / ...w<n>.
        short = self.prefix.replace("-", "")[:10]
        link = Link(index, worker_ns, self.db_ns, f"{short}d{index}", f"{short}w{index}")
        _ip(
            *("link", "add", link.db_if, "netns", self.db_ns, "type", "veth"),
            *("peer", "name", link.worker_if, "netns", worker_ns),
        )
        _ip("-n", self.db_ns, "addr", "add", f"{link.db_address}/30", "dev", link.db_if)
        _ip("-n", worker_ns, "addr", "add", f"{link.worker_address}/30", "dev", link.worker_if)
        _ip("-n", self.db_ns, "link", "set", link.db_if, "up")
        _ip("-n", worker_ns, "link", "set", link.worker_if, "up")
        self.links[worker_ns] = link
        return link

    def pids(self, namespace: str) -> list[int]:
        if namespace not in self._namespaces:
            return []
        try:
            out = _ip("netns", "pids", namespace)
        except NetnsError:
            return []
        return [int(p) for p in out.split()]

    def kill_processes(self, namespace: str, timeout: float = 10) -> list[int]:
        """SIGKILL every process inside ``namespace`` and wait until none is left; returns their pids."""
        killed: set[int] = set()

        def none_left() -> bool:
            pids = self.pids(namespace)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            return not pids

        if not wait_until(none_left, timeout, interval=0.02):
            raise NetnsError(
                f"processes {self.pids(namespace)} of {namespace} outlived SIGKILL by {timeout}s"
            )
        return sorted(killed)

    def kill_host(self, namespace: str) -> list[int]:
        """The host dies: every process in it SIGKILLed, then the namespace (and its link) deleted."""
        killed = self.kill_processes(namespace)
        self._delete(namespace)
        self.links.pop(namespace, None)
        return killed

    def _delete(self, namespace: str) -> None:
        if namespace in self._namespaces:
            _ip("netns", "delete", namespace)
            self._namespaces.remove(namespace)

    def destroy(self) -> None:
        """Kill every process in every namespace of this run and delete the namespaces. Safe twice."""
        errors = []
        for namespace in reversed(list(self._namespaces)):
            try:
                self.kill_processes(namespace)
                self._delete(namespace)
            except NetnsError as exc:
                errors.append(str(exc))
        self.links.clear()
        atexit.unregister(self.destroy)
        if errors:
            raise NetnsError("; ".join(errors))
