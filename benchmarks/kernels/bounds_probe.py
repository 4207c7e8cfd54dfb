"""One step of a kernel benchmark's case, run for Nsight Compute in a process of its own: `benchmarks.kernels.bounds`
starts it under `ncu`, which profiles only the kernels launched inside the capture window this module opens after
warm-up (autotuning, compilation and the inputs' set-up stay outside).

Usage (what `benchmarks.kernels.bounds` runs for each probe):
    python -m benchmarks.kernels.bounds_probe SPEC_JSON
SPEC_JSON: {"bench": "embedding_bag" | "hstu_attention", "config": path, "case": name, "step": "fwd" | "fwd_bwd"
(attention only), "calls": N, "capture": "nvtx" | "profiler_api"}.
- capture "profiler_api": cudaProfilerStart/Stop around the calls (ncu --profile-from-start off), every thread's
  kernels, autograd's backward thread included;
- capture "nvtx": an NVTX range "probe" around the calls (ncu --nvtx --nvtx-include probe/), the calling thread's
  kernels only: a backward run by autograd's device thread is outside it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def embedding_bag_step(config: Path, case: str, device: torch.device) -> Callable[[], Any]:
    """The Triton step of one embedding-bag case at its benchmark shape (the forward autotuned at full size first,
    as the benchmark does)."""
    from benchmarks.kernels import embedding_bag as eb

    settings = eb.load_settings(config, {})
    (c,) = [c for c in eb.all_cases(settings) if c.name == case]
    p, grad_output = eb.tuned_problem(c, settings, device)
    return eb.ours_step(c, p, grad_output)


def attention_step(config: Path, case: str, step: str, device: torch.device) -> Callable[[], Any]:
    """The Triton forward or forward + backward of one HSTU attention case (the benchmark's dtype and seed)."""
    from benchmarks.kernels import hstu_attention as ha
    from recsys.ops.hstu_attention import Kernel

    settings = ha.load_settings(config, {})
    (c,) = [c for c in settings.cases if c.name == case]
    p = ha.make_problem(c, ha.DTYPES[settings.dtype], settings.seed, device)
    return ha.steps_of(ha.attention(Kernel.TRITON, c), p)[step]


def main(argv: list[str] | None = None) -> None:
    (spec_json,) = argv if argv is not None else sys.argv[1:]
    spec = json.loads(spec_json)
    device = torch.device("cuda")
    if spec["bench"] == "embedding_bag":
        fn = embedding_bag_step(Path(spec["config"]), spec["case"], device)
    else:
        fn = attention_step(Path(spec["config"]), spec["case"], spec["step"], device)
    for _ in range(3):  # autotuning, compilation and allocation, outside the capture
        fn()
    torch.cuda.synchronize()
    if spec["capture"] == "nvtx":
        with torch.cuda.nvtx.range("probe"):
            for _ in range(spec["calls"]):
                fn()
            torch.cuda.synchronize()
        return
    torch.cuda.cudart().cudaProfilerStart()
    for _ in range(spec["calls"]):
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main()
