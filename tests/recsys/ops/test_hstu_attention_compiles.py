"""The HSTU attention kernels compile for a Hopper GPU (sm_90) with Triton's own compiler, no GPU needed.

Triton's interpreter (the CPU tests) runs the kernels as Python and never sees Triton's code generator; this test
takes them through it (AST -> TTIR -> TTGIR -> LLVM -> PTX -> cubin, with the ptxas of the triton wheel) in a
fresh process without TRITON_INTERPRET, for two variants of each kernel (bf16 with the tanh.approx sigmoid in its
PTX, fp32 without), and each one's config that reads through tensor descriptors (TMA's bulk copies in its PTX).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

NVIDIA_BACKEND = importlib.util.find_spec("triton.backends.nvidia")
pytestmark = pytest.mark.skipif(
    NVIDIA_BACKEND is None or not (Path(NVIDIA_BACKEND.origin or "").parent / "bin" / "ptxas").exists(),
    reason="the triton wheel has no NVIDIA backend with ptxas here",
)

COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from recsys.ops.triton import hstu_attention as kernels

POINTERS = {"offsets_ptr": "*i64", "ts_ptr": "*i64", "qt_ptr": "*i64", "pos_bias_ptr": "*fp32",
            "time_bias_ptr": "*fp32", "dpos_ptr": "*fp32", "dtime_ptr": "*fp32"}

def signature(fn, dtype, constants):
    def kind(name):
        if name in constants:
            return "constexpr"
        if name.endswith("_ptr"):
            return POINTERS.get(name, "*" + dtype)
        return "fp32" if name == "scale" else "i32"
    return {name: kind(name) for name in fn.arg_names}

for autotuned in kernels.AUTOTUNED_KERNELS:
    variants = [("bf16", True, (64, 64), False), ("fp32", False, (32, 32), False)]
    variants.append(("bf16", True, (64, 64), True))  # its config reading through tensor descriptors too
    for dtype, has_time, blocks, tma in variants:
        config = next(c for c in autotuned.configs
                      if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) == blocks and c.kwargs.get("TMA", False) == tma)
        fast = dtype != "fp32"  # as kernels._constants: bf16 takes the tanh.approx sigmoid
        constants = {"HEAD_DIM": 64, "BLOCK_E": 64, "HAS_TIME": has_time, **config.kwargs,
                     "PRECISION": "ieee" if dtype == "fp32" else "tf32", "FAST": fast}
        if "COPIES" in autotuned.fn.arg_names:
            constants["COPIES"] = kernels.BIAS_COPIES
        if "TMA_OK" in autotuned.fn.arg_names:
            constants["TMA_OK"] = tma
        source = ASTSource(autotuned.fn, signature(autotuned.fn, dtype, constants), constants)
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
        assert compiled.asm["cubin"], autotuned.fn.__name__
        assert ("tanh.approx.f32" in compiled.asm["ptx"]) == fast, autotuned.fn.__name__
        assert ("cp.async.bulk.tensor" in compiled.asm["ptx"]) == tma, autotuned.fn.__name__  # TMA loads, or none
        print(autotuned.fn.__name__, dtype, has_time, tma, "ok")
"""


def test_kernels_compile_for_sm90() -> None:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # Triton 3.9 warns when it is unset
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", COMPILE], env=env, cwd=root, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(" ok") == 9, done.stdout
