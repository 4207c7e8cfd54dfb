"""End-to-end effect of the Triton kernels on a training step: SASRec's semantic-ID lookups (the embedding bag) and
HSTU's attention, `torch` vs `triton`; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.kernels.training_step   # on a CUDA GPU
    .venv/bin/python -m benchmarks.kernels.training_step --config benchmarks/configs/kernels-training-step-smoke.yaml
        # tiny sizes; on CPU in Triton's interpreter

SASRec with semantic-ID features (`sid_levels` 3) looks every item up as an embedding bag of its 3 prefix
ids, and builds the whole (V+1, D) item table each step for the softmax; its `embedding_kernel` is timed as
`torch` and `triton`. HSTU's `attention_kernel` is timed the same way (dense masked rows vs the jagged Triton
attention). One training step = the NextItemRecipe loss on a packed batch, backward, and an Adam step, exactly as
`recsys.training.trainer` runs it (bf16 autocast on CUDA); the same model and batch for both kernels. Cases
(benchmarks/configs/kernels-training-step.yaml; `--config`, `--set KEY=VALUE`): SASRec at the Beauty shape of
configs/beauty/sasrec-sid.yaml (12,101 items, D=64, full softmax) and on a 1M-item catalog (sampled softmax with
1,024 negatives), HSTU on a 1M-item catalog with the attention benchmark's shape (128 rows of 200, 2 heads of 64).
Writes benchmarks/results/<result_name>.json (default kernels-training-step-{device}, `{device}` the GPU's short
name; `-smoke` appended for a `smoke: true` config), with the settings and how to reproduce it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from benchmarks.common import benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from benchmarks.kernels.embedding_bag import cpu_timer_mismatch, kernel_device, make_timer, result_head
from recsys.data.batching import PackedBatch, packed_next_item_batches
from recsys.data.jagged import Jagged
from recsys.models.hstu import HSTU, HSTUConfig
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.training.recipes import NextItemRecipe


@dataclass(frozen=True)
class StepCase:
    """One model and batch shape, timed with both kernels (SASRec's lookups, HSTU's attention)."""

    name: str
    model: Literal["sasrec", "hstu"]
    num_items: int  # V
    dim: int  # D
    rows: int  # packed rows of max_history tokens per batch
    max_history: int  # the model's window = the packed row width
    sid_levels: int  # SASRec: semantic-ID prefixes looked up per item (an embedding bag of this many ids)
    codebook_size: int  # SASRec: ids per semantic-ID level (random codes)
    loss: Literal["full_softmax", "sampled_softmax"]
    num_negatives: int  # sampled_softmax: negatives per batch (uniform over the catalog)
    num_heads: int = 2


@dataclass(frozen=True)
class Settings:
    """What the benchmark measures (benchmarks/configs/kernels-training-step*.yaml)."""

    # a quick check, not a measurement: it may run on CPU (Triton's interpreter) and its result is named `-smoke`
    smoke: bool
    cpu_repeats: int  # on CPU, timed steps per kernel (median, after one warm-up); on CUDA do_bench decides
    cases: tuple[StepCase, ...]
    result_name: str = "kernels-training-step-{device}"  # benchmarks/results/<this>.json, `{device}` the GPU's


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def make_batch(num_items: int, rows: int, max_history: int, generator: torch.Generator) -> PackedBatch:
    """One packed batch of `rows` rows of `max_history` tokens from random user sequences (lengths 3..20, uniform
    items among `num_items`)."""
    lengths = torch.randint(3, 21, (rows * max_history // 8,), generator=generator)
    values = torch.randint(1, num_items + 1, (int(lengths.sum()),), generator=generator)
    sequences = Jagged(values, torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]))
    return next(iter(packed_next_item_batches(sequences, max_history, rows, generator)))


def make_step(
    c: StepCase,
    kernel: Literal["torch", "triton"],
    batch: PackedBatch,
    codes: torch.Tensor | None,
    device: torch.device,
) -> Any:
    """A closure running one training step of a fresh model (same seed for both kernels)."""
    torch.manual_seed(0)
    model: torch.nn.Module
    if c.model == "hstu":
        model = HSTU(HSTUConfig(num_items=c.num_items, max_history=c.max_history, dim=c.dim, num_heads=c.num_heads,
                                attention_kernel=kernel))  # fmt: skip
    else:
        config = SASRecConfig(
            num_items=c.num_items, max_history=c.max_history, dim=c.dim, num_heads=c.num_heads,
            sid_levels=c.sid_levels, embedding_kernel=kernel,
        )  # fmt: skip
        model = SASRec(config, codes)
    model = model.to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    probs = None
    if c.loss == "sampled_softmax":
        probs = torch.full((c.num_items + 1,), 1.0 / c.num_items)
        probs[0] = 0.0
    recipe = NextItemRecipe(c.max_history, c.rows, sampling_probs=probs, num_negatives=c.num_negatives)
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
    codes = None
    if c.sid_levels:
        codes = torch.randint(0, c.codebook_size, (c.num_items + 1, c.sid_levels), generator=generator)
        codes[0] = -1
    batch = make_batch(c.num_items, c.rows, c.max_history, generator)
    times = {kernel: timer(make_step(c, kernel, batch, codes, device)) for kernel in ("torch", "triton")}
    return {
        **asdict(c),
        "targets_per_step": int((batch.targets != 0).sum()),
        "torch_ms": significant(times["torch"]),
        "triton_ms": significant(times["triton"]),
        "ratio_vs_torch": significant(times["torch"] / times["triton"]),
    }


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/kernels-training-step.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    device = kernel_device(settings.smoke, "benchmarks/configs/kernels-training-step-smoke.yaml")
    name, head = result_head(device, settings.result_name, settings.smoke)

    timer, timer_note = make_timer(device, settings.cpu_repeats)
    cases = []
    for c in settings.cases:
        cases.append(run_case(c, device, timer))
        r = cases[-1]
        print(f"{c.name}: torch {r['torch_ms']:.3f} ms, triton {r['triton_ms']:.3f} ms, x{r['ratio_vs_torch']:.2f}")
    result = {
        **head,
        "timer": timer_note,
        "step": "NextItemRecipe loss + backward + Adam step; bf16 autocast on CUDA; SASRec (sid_levels 3): "
        "embedding_kernel torch vs triton, HSTU: attention_kernel torch vs triton",
        "notes": {"ratio_vs_torch": "torch_ms / triton_ms: above 1 means the Triton kernels make the step faster"},
        "cases": cases,
        **provenance("triton"),
    }
    path = write_result(name, result, args.results_dir, reproduce)
    print(f"-> {path}")
    return path


def recorded_mismatches(result: dict[str, Any], settings: Settings) -> Iterator[str]:
    """What the result records of its settings (smoke, the CPU timer's repeats, every case's shape) that differs
    from `settings`. Results from before the configs name the window `max_len`."""
    if result.get("smoke") != settings.smoke:
        yield f"smoke: the result has {result.get('smoke')!r}, the config {settings.smoke!r}"
    yield from cpu_timer_mismatch(result.get("timer"), settings.cpu_repeats)
    recorded = result.get("cases", [])
    if len(recorded) != len(settings.cases):
        yield f"cases: the result has {len(recorded)}, the config {len(settings.cases)}"
    for case, c in zip(recorded, settings.cases, strict=False):
        case = {"max_history": case.get("max_len"), **case}
        for key, value in asdict(c).items():
            if case.get(key) != value:
                yield f"cases[{c.name}].{key}: the result has {case.get(key)!r}, the config {value!r}"


if __name__ == "__main__":
    main()
