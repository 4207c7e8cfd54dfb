"""Exclusive file locks between real processes: the holder is named, kill -9 frees the lock, a waiter gets it, and a
holder that lets go removes the file without two holders ever at once."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Event
from pathlib import Path

import pytest

from recsys.runtime import lock as lock_module
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
        assert lock.previous is None  # the holder before let go: nothing to recover from it


def test_a_holder_that_lets_go_leaves_no_file_even_on_an_error(tmp_path: Path) -> None:
    path = tmp_path / "lock"
    with exclusive_lock(path, what="x", fix="y"):
        assert path.exists()
    assert not path.exists()
    with pytest.raises(ZeroDivisionError), exclusive_lock(path, what="x", fix="y"):
        _ = 1 / 0
    assert not path.exists()


def _count(path: Path, counter: Path, times: int) -> None:
    for _ in range(times):
        with exclusive_lock(path, what="x", fix="y", wait_s=60):
            value = int(counter.read_text())  # read, pause, write: two holders at once would lose an increment
            time.sleep(0.001)
            counter.write_text(str(value + 1))


def test_processes_taking_turns_never_hold_it_two_at_once(tmp_path: Path) -> None:
    path, counter = tmp_path / "lock", tmp_path / "counter"
    counter.write_text("0")
    processes = [FORK.Process(target=_count, args=(path, counter, 40)) for _ in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    assert int(counter.read_text()) == 4 * 40


def test_a_lock_taken_on_the_file_its_holder_just_removed_is_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "lock"
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with exclusive_lock(path, what="x", fix="y"):
            held.set()
            release.wait(30)

    other = threading.Thread(target=hold)
    other.start()
    assert held.wait(30)
    real_try_lock = lock_module._try_lock

    def after_the_holder_let_go(fd: int) -> bool:  # it lets go between this opening the file and locking it
        if not release.is_set():
            release.set()
            other.join(30)
        return real_try_lock(fd)

    monkeypatch.setattr(lock_module, "_try_lock", after_the_holder_let_go)
    with exclusive_lock(path, what="x", fix="y", wait_s=5):
        assert path.exists()  # locked at the path, where the next one to come finds it; not the removed file
