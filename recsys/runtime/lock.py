"""Exclusive advisory file locks (`fcntl.flock`): one holder at a time, released by the OS when the holder's process
ends, kill -9 included, so a crash never leaves a stale lock behind.

The lock file records its holder (pid, host, since when, a token unique to the acquisition), so whoever finds it
held can say by whom. A holder that lets go (an error included) removes the file; a killed one's stays, so a new
holder knows who held it before and was killed.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from recsys.errors import RecsysError

_POLL_S = 0.1  # how often a waiting process tries again


@dataclass(frozen=True)
class LockHolder:
    pid: int
    host: str
    since: str  # ISO 8601, UTC
    token: str  # unique to one acquisition

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host} since {self.since}"


@dataclass(frozen=True)
class HeldLock:
    holder: LockHolder  # this process
    previous: LockHolder | None  # the holder killed before this one took the lock, if any

    def outlived(self, host: str, token: str) -> bool:
        """Whether the holder that acquired this lock with `token` on `host` is gone: the last holder before this
        one, or any earlier holder on this host (the lock, once this process holds it, outlived them all)."""
        if token == self.holder.token:
            return False
        return host == self.holder.host or (self.previous is not None and token == self.previous.token)


class LockHeldError(RecsysError):
    """Someone else holds the lock; the message names them and the fix."""


@contextmanager
def exclusive_lock(path: Path, *, what: str, fix: str, wait_s: float = 0.0) -> Iterator[HeldLock]:
    """Hold the lock file `path` for the block.

    Args:
        what: what the lock guards, for the error, e.g. "pipeline NAME under WORK is being run" (" by pid ..." follows).
        fix: what to do when it is held, for the error.
        wait_s: how long to wait for the holder to let go; 0: raise `LockHeldError` at once.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_locked(path, time.monotonic() + wait_s, wait_s, what=what, fix=fix)
    try:
        previous = _read_holder(fd)
        me = LockHolder(os.getpid(), socket.gethostname(), datetime.now(UTC).isoformat(timespec="seconds"),
                        uuid.uuid4().hex)  # fmt: skip
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(asdict(me)).encode(), 0)
        try:
            yield HeldLock(me, previous)
        finally:  # a normal exit or an error: no file left to look stale (a killed holder's stays, naming it)
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)  # releases the lock


def _open_locked(path: Path, deadline: float, wait_s: float, *, what: str, fix: str) -> int:
    """A descriptor of the file at `path`, locked. A holder removes the file as it lets go, so a lock taken on a file
    no longer at `path` guards nothing: open the path again."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            locked = _try_lock(fd)
            if locked and _is_at(fd, path):
                return fd
            if not locked and time.monotonic() >= deadline:
                holder = _read_holder(fd)
                waited = f" (waited {wait_s:g} s)" if wait_s else ""
                raise LockHeldError(f"{what} by {holder or 'another process'}{waited}. Fix: {fix}")
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        if not locked:
            time.sleep(_POLL_S)


def _is_at(fd: int, path: Path) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _read_holder(fd: int) -> LockHolder | None:
    """The holder recorded in the lock file; None when there is none (a new file, or its holder is writing it)."""
    try:
        return LockHolder(**json.loads(os.pread(fd, 4096, 0)))
    except (ValueError, TypeError):
        return None
