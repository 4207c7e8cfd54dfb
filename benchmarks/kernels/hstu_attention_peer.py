"""Meta generative-recommenders' Triton HSTU attention timed on one case of `benchmarks.kernels.hstu_attention`, in a
process of its own: a peer kernel that faults (an illegal memory access poisons the CUDA context) loses its own
timings, not the run's.

Usage (what `benchmarks.kernels.hstu_attention` runs for each case when `peer_checkout` is set):
    python -m benchmarks.kernels.hstu_attention_peer CHECKOUT CASE_JSON DTYPE SEED
prints one JSON line, {"fwd": {ms, flops, TFLOPs}, "fwd_bwd": {...}}.

The peer (`generative_recommenders.ops.triton.triton_hstu_attention.triton_hstu_mha`) computes silu(q k^T) / L @ v
under the causal mask with no position or time bias (its kernel dropped them), on the same jagged q, k, v as ours
(contiguous copies, as its own dispatcher makes them), autotuned per sequence length. Its flops are counted as ours
are (the causal pairs' matmuls), so its TFLOP/s compare with ours.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from benchmarks.common import significant
from benchmarks.kernels.embedding_bag import make_timer
from benchmarks.kernels.hstu_attention import DTYPES, AttentionCase, flops, make_problem


def main(argv: list[str] | None = None) -> None:
    checkout, case_json, dtype, seed = argv if argv is not None else sys.argv[1:]
    sys.path.insert(0, str(Path(checkout).resolve()))
    from generative_recommenders import common  # the peer's own code, from the checkout
    from generative_recommenders.ops.triton.triton_hstu_attention import triton_hstu_mha

    common.set_use_runtime_max_seq_len(True)  # else the config tuned at the first length serves every length
    c = AttentionCase(**json.loads(case_json))
    device = torch.device("cuda")
    p = make_problem(c, DTYPES[dtype], int(seed), device)
    shape = (p.qkvu.shape[0], c.heads, c.head_dim)
    _, v, q, k = (t.view(shape).detach().contiguous().requires_grad_() for t in p.qkvu.chunk(4, dim=-1))

    def fwd() -> torch.Tensor:
        return triton_hstu_mha(N=c.seq_len, alpha=1.0, q=q, k=k, v=v, seq_offsets=p.offsets)

    def fwd_bwd() -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(fwd(), [q, k, v], p.grad_out)

    timer, _ = make_timer(device, 1)
    out = {}
    for step, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
        fn()  # autotune before the timer's first (estimating) call
        ms = timer(fn)
        work = flops(c, p, step)
        out[step] = {"ms": significant(ms), "flops": work, "TFLOPs": significant(work / (ms * 1e9))}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
