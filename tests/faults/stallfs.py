"""A FUSE passthrough whose ``fsync`` stalls, or whose writes fail with ``ENOSPC``, on command
(issue 51): ``python -m tests.faults.stallfs BACKING MOUNTPOINT CONTROL``.

Every operation is passed to the directory ``BACKING``, as the file ``CONTROL`` says (re-read
at most every 50 ms):

- ``delay S``: each fsync (and fsyncdir) takes S seconds more (a saturated, throttled volume);
- ``until T``: each fsync waits until the wall-clock time T (one long stall: every commit of
  the moment waits for it);
- ``full``: the disk is full: a write past a file's end, a growing truncate, a new directory
  or symlink fails with ``ENOSPC`` (what a full ext4 answers: an empty file can still be
  created, a file's own blocks rewritten), and ``statfs`` says no block is free;
- anything else, or no file: passed through as is.

Mounted ``allow_other`` (PostgreSQL runs as ``postgres``), run as root; files and directories
created through it are given to the calling user, as a kernel filesystem would. Debian's
``libfuse2`` (:func:`tests.support.debian.ensure_debian_package`) and PyPI's ``fusepy`` (the
``test`` dependency group) are what it needs. :class:`StallFs` mounts it from a test and
unmounts it (``fusermount -u``, then a lazy ``umount``) whatever happens.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.waiting import wait_until

FUSE_LIBRARY = Path("/usr/lib/x86_64-linux-gnu/libfuse.so.2")


class StallFs:
    """The passthrough process for one mount point; :meth:`delay` / :meth:`stall_until` /
    :meth:`fill` / :meth:`clear`."""

    def __init__(self, backing: Path, mountpoint: Path, control: Path, log: Path) -> None:
        self.backing = backing
        self.mountpoint = mountpoint
        self.control = control
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def mount(self, timeout: float = 30) -> None:
        from tests.support.debian import ensure_debian_package

        ensure_debian_package("libfuse2", [FUSE_LIBRARY])
        if not Path("/dev/fuse").exists():
            raise RuntimeError("/dev/fuse is missing: the fsync-stall scenarios need FUSE")
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.clear()
        atexit.register(self.unmount)
        with open(self.log, "ab") as out:
            proc = self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.faults.stallfs",
                    str(self.backing),
                    str(self.mountpoint),
                    str(self.control),
                ],
                cwd=Path(__file__).resolve().parents[2],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if not wait_until(lambda: os.path.ismount(self.mountpoint) or proc.poll() is not None, timeout):
            raise RuntimeError(
                f"the stall filesystem was not mounted in {timeout}s: {self.log.read_text()[-2000:]}"
            )
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"the stall filesystem exited ({self.proc.returncode}): {self.log.read_text()[-2000:]}"
            )

    def _write(self, text: str) -> None:
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.control)

    def delay(self, seconds: float) -> None:
        self._write(f"delay {seconds}\n")

    def stall_until(self, at: float) -> None:
        self._write(f"until {at}\n")

    def fill(self) -> None:
        """Refuse what needs new space with ENOSPC (a full disk) until :meth:`clear`."""
        self._write("full\n")

    def clear(self) -> None:
        self._write("none\n")

    def unmount(self) -> None:
        with contextlib.suppress(OSError):
            self.clear()
        if os.path.ismount(self.mountpoint):
            for cmd in (
                ["fusermount", "-u", str(self.mountpoint)],
                ["umount", "--lazy", str(self.mountpoint)],
            ):
                if shutil.which(cmd[0]) is None:
                    continue
                if subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0:
                    break
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
            self.proc = None
        atexit.unregister(self.unmount)


def serve(backing: str, mountpoint: str, control: str) -> None:  # pragma: no cover - a child process
    from fuse import FUSE, FuseOSError, Operations, fuse_get_context

    class Control:
        def __init__(self) -> None:
            self.read_at = 0.0
            self.kind: str = "none"
            self.value: float = 0.0
            self.lock = threading.Lock()

        def read(self) -> tuple[str, float]:
            with self.lock:
                if time.monotonic() - self.read_at > 0.05:
                    self.read_at = time.monotonic()
                    try:
                        name, _, number = Path(control).read_text().strip().partition(" ")
                        self.kind, self.value = name, float(number or 0)
                    except (OSError, ValueError):
                        self.kind, self.value = "none", 0.0
                return self.kind, self.value

        def refuse_if_full(self) -> None:
            if self.read()[0] == "full":
                raise FuseOSError(errno.ENOSPC)

        def wait(self) -> float:
            kind, value = self.read()
            if kind == "delay":
                return value
            if kind == "until":
                return max(0.0, value - time.time())
            return 0.0

    stall = Control()

    class Passthrough(Operations):
        def _full(self, path: str) -> str:
            return os.path.join(backing, path.lstrip("/"))

        def _own(self, path: str) -> None:
            uid, gid, _pid = fuse_get_context()
            os.lchown(path, uid, gid)

        def access(self, path: str, mode: int) -> None:
            if not os.access(self._full(path), mode):
                raise FuseOSError(errno.EACCES)

        def chmod(self, path: str, mode: int) -> None:
            os.chmod(self._full(path), mode)

        def chown(self, path: str, uid: int, gid: int) -> None:
            os.lchown(self._full(path), uid, gid)

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            st = os.lstat(self._full(path))
            keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")
            return {key: getattr(st, key) for key in keys}

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", *os.listdir(self._full(path))]

        def readlink(self, path: str) -> str:
            return os.readlink(self._full(path))

        def mknod(self, path: str, mode: int, dev: int) -> None:
            os.mknod(self._full(path), mode, dev)
            self._own(self._full(path))

        def rmdir(self, path: str) -> None:
            os.rmdir(self._full(path))

        def mkdir(self, path: str, mode: int) -> None:
            stall.refuse_if_full()
            os.mkdir(self._full(path), mode)
            self._own(self._full(path))

        def statfs(self, path: str) -> dict[str, Any]:
            st = os.statvfs(self._full(path))
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag")
            found = {key: getattr(st, key) for key in (*keys, "f_frsize", "f_namemax")}
            if stall.read()[0] == "full":
                found.update(f_bavail=0, f_bfree=0)
            return found

        def unlink(self, path: str) -> None:
            os.unlink(self._full(path))

        def symlink(self, name: str, target: str) -> None:
            stall.refuse_if_full()
            os.symlink(target, self._full(name))

        def rename(self, old: str, new: str) -> None:
            os.rename(self._full(old), self._full(new))

        def link(self, target: str, name: str) -> None:
            os.link(self._full(name), self._full(target))

        def utimens(self, path: str, times: tuple[float, float] | None = None) -> None:
            os.utime(self._full(path), times)

        def open(self, path: str, flags: int) -> int:
            return os.open(self._full(path), flags)

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            fd = os.open(self._full(path), os.O_RDWR | os.O_CREAT, mode)
            self._own(self._full(path))
            return fd

        def read(self, path: str, length: int, offset: int, fh: int) -> bytes:
            return os.pread(fh, length, offset)

        def write(self, path: str, buf: bytes, offset: int, fh: int) -> int:
            if offset + len(buf) > os.fstat(fh).st_size:
                stall.refuse_if_full()
            return os.pwrite(fh, buf, offset)

        def truncate(self, path: str, length: int, fh: int | None = None) -> None:
            with open(self._full(path), "r+b") as f:
                if length > os.fstat(f.fileno()).st_size:
                    stall.refuse_if_full()
                f.truncate(length)

        def flush(self, path: str, fh: int) -> None:
            return None

        def release(self, path: str, fh: int) -> None:
            os.close(fh)

        def fsync(self, path: str, fdatasync: int, fh: int) -> None:
            wait = stall.wait()
            if wait > 0:
                time.sleep(wait)
            if fdatasync:
                os.fdatasync(fh)
            else:
                os.fsync(fh)

        def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
            wait = stall.wait()
            if wait > 0:
                time.sleep(wait)

    FUSE(Passthrough(), mountpoint, foreground=True, allow_other=True, nothreads=False)


if __name__ == "__main__":
    serve(*sys.argv[1:4])
