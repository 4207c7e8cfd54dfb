"""The launcher shares the host's cores among the processes it starts: each gets `cores // processes` threads unless
the user chose, and the launching process's environment is left as it was."""

from __future__ import annotations

import os

import pytest

from pipelines.launcher import THREAD_VARIABLES, cores_shared


def test_each_process_gets_its_share_of_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 32)

    with cores_shared(2):
        inside = {name: os.environ[name] for name in THREAD_VARIABLES}
    with cores_shared(64):
        at_least_one = os.environ["OMP_NUM_THREADS"]

    assert inside == {name: "16" for name in THREAD_VARIABLES}
    assert at_least_one == "1"
    assert not any(name in os.environ for name in THREAD_VARIABLES)


def test_a_thread_count_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("POLARS_MAX_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)

    with cores_shared(2):
        inside = os.environ["OMP_NUM_THREADS"], os.environ["POLARS_MAX_THREADS"]

    assert inside == ("3", "4")
    assert os.environ["OMP_NUM_THREADS"] == "3" and "POLARS_MAX_THREADS" not in os.environ
