"""End-to-end effect of the embedding-bag kernel: SASRec training-step time, Triton vs torch lookups; writes JSON.

Usage:
    python benchmarks/kernels/training_step.py                  # on a CUDA GPU
    .venv/bin/python benchmarks/kernels/training_step.py --smoke   # tiny sizes; on CPU in Triton's interpreter

SASRec with semantic-ID features (`sid_levels` 3) looks every item up as an embedding bag of its 3 prefix
ids, and builds the whole (V+1, D) item table each step for the softmax. One training step = the
NextItemRecipe loss on a packed batch, backward, and an Adam step, exactly as `recsys.training.trainer`
runs it (bf16 autocast on CUDA). The same model and batch are timed with `embedding_kernel: torch` and
`triton`. Cases: the Beauty shape of configs/beauty-sasrec-sid.yaml (12,101 items, D=64, full softmax) and
a 1M-item catalog (D=64, sampled softmax with 1,024 negatives), where the lookups weigh more.
Writes benchmarks/results/kernels-training-step-<gpu>.json (`-smoke` appended with --smoke).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.common import RESULTS_DIR, command, machine, significant, versions, write_result
from benchmarks.kernels.embedding_bag import gpu_name, make_timer
from recsys.data.batching import PackedBatch, packed_next_item_batches
from recsys.data.jagged import Jagged
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.training.recipes import NextItemRecipe


@dataclass(frozen=True)
class StepCase:
    name: str
    num_items: int
    dim: int
    rows: int  # packed rows of max_len tokens per batch
    max_len: int = 50
    sid_levels: int = 3
    codebook_size: int = 256
    loss: Literal["full_softmax", "sampled_softmax"] = "full_softmax"
    num_negatives: int = 1024


CASES = [
    StepCase("beauty", num_items=12_101, dim=64, rows=16),
    StepCase("catalog-1m", num_items=1_000_000, dim=64, rows=16, loss="sampled_softmax"),
]
SMOKE_CASES = [
    StepCase("smoke", num_items=40, dim=8, rows=1, max_len=8, codebook_size=4),
    StepCase("smoke-sampled", num_items=40, dim=8, rows=1, max_len=8, codebook_size=4, loss="sampled_softmax",
             num_negatives=8),
]  # fmt: skip


def make_batch(c: StepCase, generator: torch.Generator) -> PackedBatch:
    """One packed batch of random user sequences (lengths 3..20, uniform items)."""
    lengths = torch.randint(3, 21, (c.rows * c.max_len // 8,), generator=generator)
    values = torch.randint(1, c.num_items + 1, (int(lengths.sum()),), generator=generator)
    sequences = Jagged(values, torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]))
    return next(iter(packed_next_item_batches(sequences, c.max_len, c.rows, generator)))


def make_step(
    c: StepCase, kernel: Literal["torch", "triton"], batch: PackedBatch, codes: torch.Tensor, device: torch.device
) -> Any:
    """A closure running one training step of a fresh model (same seed for both kernels)."""
    torch.manual_seed(0)
    config = SASRecConfig(
        num_items=c.num_items, max_len=c.max_len, dim=c.dim, sid_levels=c.sid_levels, embedding_kernel=kernel
    )
    model = SASRec(config, codes).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    probs = None
    if c.loss == "sampled_softmax":
        probs = torch.full((c.num_items + 1,), 1.0 / c.num_items)
        probs[0] = 0.0
    recipe = NextItemRecipe(c.max_len, c.rows, None, probs, c.num_negatives)
    generator = torch.Generator().manual_seed(0)
    on_device = batch.to(device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss, _ = recipe.loss(model, on_device, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def run_case(c: StepCase, device: torch.device, timer: Any) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, c.codebook_size, (c.num_items + 1, c.sid_levels), generator=generator)
    codes[0] = -1
    batch = make_batch(c, generator)
    times = {kernel: timer(make_step(c, kernel, batch, codes, device)) for kernel in ("torch", "triton")}
    return {
        **asdict(c),
        "targets_per_step": int((batch.targets != 0).sum()),
        "torch_ms": significant(times["torch"]),
        "triton_ms": significant(times["triton"]),
        "ratio_vs_torch": significant(times["torch"] / times["triton"]),
    }


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, few runs (on CPU: Triton's interpreter)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda":
        if not args.smoke:
            raise SystemExit("no CUDA device: this benchmark is for a GPU; pass --smoke for a quick run on CPU")
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before `triton` is first imported
    import triton

    timer, timer_note = make_timer(device, args.smoke)
    cases = []
    for c in SMOKE_CASES if args.smoke else CASES:
        cases.append(run_case(c, device, timer))
        r = cases[-1]
        print(f"{c.name}: torch {r['torch_ms']:.3f} ms, triton {r['triton_ms']:.3f} ms, x{r['ratio_vs_torch']:.2f}")
    gpu, slug = gpu_name(device)
    name = f"kernels-training-step-{slug}" + ("-smoke" if args.smoke else "")
    result = {
        "name": name,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "smoke": args.smoke,
        "timer": timer_note,
        "step": "SASRec (sid_levels 3) NextItemRecipe loss + backward + Adam step; bf16 autocast on CUDA",
        "notes": {"ratio_vs_torch": "torch_ms / triton_ms: above 1 means the Triton lookups make the step faster"},
        "cases": cases,
        "machine": machine(),
        "versions": versions("triton"),
        "command": command(),
    }
    path = write_result(name, result, args.results_dir)
    print(f"-> {path}")
    return path


if __name__ == "__main__":
    main()
