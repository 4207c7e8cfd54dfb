"""Exclusive file locks between real processes: the holder is named, kill -9 frees the lock, a waiter gets it."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from recsys.runtime.lock import LockHeldError, exclusive_lock

FORK = multiprocessing.get_context("fork")


def _hold(path: Path, held: Event, seconds: float) -> None:
    with exclusive_lock(path, what="the test lock is held", fix="wait"):
        held.set()
        time.sleep(seconds)


@contextmanager
def holder(path: Path, seconds: float = 60.0) -> Iterator[multiprocessing.process.BaseProcess]:
    """Another process holding the lock at `path` for `seconds` (it exits then, or when killed)."""
    held = FORK.Event()
    process = FORK.Process(target=_hold, args=(path, held, seconds))
    process.start()
    try:
        assert held.wait(30), "the other process did not get the lock"
        yield process
    finally:
        process.kill()
        process.join()


def test_a_held_lock_names_its_holder_and_kill_9_frees_it(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "lock"
    with holder(path) as other:
        with pytest.raises(LockHeldError) as held, exclusive_lock(path, what="the test lock is held", fix="wait"):
            pass
        assert str(held.value).startswith(f"the test lock is held by pid {other.pid} on {socket.gethostname()} since ")
        assert str(held.value).endswith(". Fix: wait")
        os.kill(other.pid, signal.SIGKILL)  # no chance to let go: the OS releases it
        other.join()
        with exclusive_lock(path, what="the test lock is held", fix="wait") as lock:
            assert lock.holder.pid == os.getpid() and lock.previous is not None and lock.previous.pid == other.pid
            previous = lock.previous
            assert lock.outlived(previous.host, previous.token)  # the last holder: gone
            assert lock.outlived(lock.holder.host, "an earlier holder's token")  # any earlier one on this host
            assert not lock.outlived("another-host", "a token of a lock elsewhere")  # maybe live, elsewhere
            assert not lock.outlived(lock.holder.host, lock.holder.token)  # this process


def test_a_waiter_gets_the_lock_when_the_holder_lets_go(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    with holder(path, seconds=1.0):
        with (
            pytest.raises(LockHeldError, match=r"\(waited 0.2 s\)"),
            exclusive_lock(path, what="x", fix="y", wait_s=0.2),
        ):
            pass
        start = time.monotonic()
        with exclusive_lock(path, what="x", fix="y", wait_s=30) as lock:
            assert time.monotonic() - start < 20 and lock.holder.pid == os.getpid()
