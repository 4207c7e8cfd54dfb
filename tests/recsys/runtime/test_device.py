"""CPU compute choices: bf16 autocast only where the CPU has native bf16 matmuls; threads as set, or torch's default."""

from __future__ import annotations

import logging

import pytest
import torch

from recsys.runtime.device import NATIVE_BF16_FLAGS, apply_cpu_threads, cpu_flags, native_cpu_bf16, use_bf16_autocast


def test_explicit_precisions_are_obeyed() -> None:
    cpu = torch.device("cpu")
    assert use_bf16_autocast("bf16", cpu) and not use_bf16_autocast("fp32", cpu)


def test_auto_follows_the_cpu_flags_not_onednn() -> None:
    native = NATIVE_BF16_FLAGS & cpu_flags()
    assert native_cpu_bf16() == sorted(native)
    # oneDNN answers "supported" on CPUs that emulate bf16; only the flags turn it on
    assert use_bf16_autocast("auto", torch.device("cpu")) == bool(native)


def test_threads_are_set_and_logged_with_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="recsys.runtime.device"):
            apply_cpu_threads(1)
        assert torch.get_num_threads() == 1 and "CPU: 1 thread (set)" in caplog.text
        assert "bf16 matmuls" in caplog.text
    finally:
        torch.set_num_threads(before)
