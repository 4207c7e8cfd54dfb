"""Cold compilation of one training step, each in a fresh process with an empty inductor cache: the seconds to the
end of the first step and the analyses dynamo made, compiled as the trainer compiles (`compile_model`: the model's
Python floats specialised; the generative recipe's loss in one graph with the forward) against dynamo's default under
dynamic shapes (the floats traced as symbolic inputs, whose first specialisation restarts the analysis); writes JSON.
The results of 2026-11-29 (`cold-compile-cpu.json`, `cold-compile-tracing.json`) compiled the forward alone, the
loss eager.

Usage:
    .venv/bin/python -m benchmarks.cold_compile   # on CUDA when there is one, else the CPU
    .venv/bin/python -m benchmarks.cold_compile --config benchmarks/configs/cold-compile-smoke.yaml  # seconds

Settings: benchmarks/configs/cold-compile.yaml (`--config`, `--set KEY=VALUE`). Each model is built as its product
experiment config builds it (`experiments`: family and params; Beauty's 12,101 items), the generative retriever on
random unique codes of its config's levels, and trained one step of its recipe's loss (next item over packed rows;
the generative recipe over histories), bf16 autocast where the trainer would use it, backward and an Adam step. The
(model, floats) runs are interleaved, `repeats` of each, every one a process of its own (`--child`): the figures are
medians, and `speedup` is the symbolic-float run's median over the trainer's. `analyses` counts AOTAutograd's
traces of the step (1: dynamo analysed the forward once; 2: it restarted). Writes
benchmarks/results/cold-compile-<device type>.json (`result_name`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from benchmarks.common import (
    REPO,
    benchmark_parser,
    check_result_template,
    child_report,
    parse_run,
    provenance,
    result_name_for,
    settings_from,
    significant,
    synchronize,
    write_result,
)
from pipelines.config import load_config
from recsys.data.batching import HistoryBatch, PackedBatch
from recsys.models.family import ModelInputs
from recsys.models.registry import build_model
from recsys.runtime.device import resolve_device, use_bf16_autocast
from recsys.runtime.distributed import Workers
from recsys.semantic_ids.codes import SemanticIds
from recsys.training.compilation import compile_model
from recsys.training.config import CompileMode
from recsys.training.data_parallel import DataParallelLoss
from recsys.training.recipes import NextItemRecipe, Recipe
from recsys.training.recipes.pairs import GenerativeRecipe

FAMILIES = ("sasrec", "hstu", "generative")  # the models whose recipe `step_of` makes
FLOATS = ("specialised", "symbolic")  # the trainer's compilation; dynamo's default under dynamic shapes


@dataclass(frozen=True)
class Settings:
    """What the benchmark measures (benchmarks/configs/cold-compile.yaml)."""

    device: str  # "auto": cuda when there is one, else cpu
    experiments: dict[str, str]  # label -> a product experiment config whose model is compiled
    items: int  # catalog size V (Beauty: 12,101)
    rows: int  # rows per batch (the compilation does not depend on it: small keeps a CPU step short)
    repeats: int  # fresh processes per (model, floats)
    precision: Literal["auto", "bf16", "fp32"]  # as train.precision
    backend: Literal["inductor", "aot_eager"]  # aot_eager: dynamo's and AOTAutograd's tracing without codegen
    mode: CompileMode
    child_timeout_s: float  # one process's bound (a hung compilation fails the run, it does not stall it)
    result_name: str = "cold-compile-{device}"  # {device}: cpu or cuda


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def build(s: Settings, experiment: str) -> tuple[torch.nn.Module, str]:
    """The model of `experiment` for `s.items` items (a generative one on random unique codes of its `sid` levels),
    and its family."""
    config = load_config(REPO / experiment)
    if config.model.name not in FAMILIES:
        steps = ", ".join(FAMILIES)
        raise SystemExit(f"{experiment} trains a {config.model.name!r} model; this benchmark steps {steps} models. "
                         "Fix: name a config of one of those in `experiments`")  # fmt: skip
    inputs = ModelInputs()
    if config.model.name == "generative":
        if config.sid is None:
            raise SystemExit(f"{experiment} builds no semantic IDs (no `sid` section). Fix: name a generative config")
        shape = config.sid.rqkmeans if config.sid.method == "rqkmeans" else config.sid.rqvae
        inputs = ModelInputs(semantic_ids=random_codes(s.items, shape.levels, shape.codebook_size))
    return build_model(config.model.name, config.model.params, s.items, inputs), config.model.name


def random_codes(items: int, levels: int, codebook_size: int) -> SemanticIds:
    """`levels` levels of `codebook_size` codes, unique per item (the first two spell its index, the others are
    random), and a de-duplication level of one code; row 0 the padding's -1s."""
    if levels < 2 or items > codebook_size**2:
        raise SystemExit(f"{items} items do not fit {levels} levels of {codebook_size} codes. Fix: fewer `items`")
    index = torch.arange(items)
    rest = torch.randint(0, codebook_size, (items, levels - 2), generator=torch.Generator().manual_seed(0))
    codes = torch.cat([(index % codebook_size)[:, None], (index // codebook_size)[:, None], rest,
                       torch.zeros(items, 1, dtype=torch.long)], dim=1)  # fmt: skip
    padding = torch.full((1, levels + 1), -1, dtype=torch.long)
    return SemanticIds(torch.cat([padding, codes]), (*[codebook_size] * levels, 1))


def step_of(s: Settings, model: torch.nn.Module, family: str, device: torch.device) -> tuple[Recipe, Any]:
    """The family's recipe and one batch of random items on `device`."""
    generator = torch.Generator().manual_seed(0)
    window = int(model.config.max_history)  # every sequential model's window
    items = torch.randint(1, s.items + 1, (s.rows, window + 1), generator=generator)
    if family == "generative":
        batch = HistoryBatch(items[:, :-1], items[:, -1], torch.arange(1, s.rows + 1))
        return GenerativeRecipe(window, s.rows), batch.to(device)
    ones = torch.ones(s.rows, window, dtype=torch.long)
    packed = PackedBatch(items[:, :-1], items[:, 1:], ones, torch.arange(window).expand(s.rows, -1))
    return NextItemRecipe(window, s.rows), packed.to(device)


def first_step(s: Settings, label: str, floats: str) -> dict[str, Any]:
    """In this process: compile `label`'s model as the trainer does (its forward; with it, for a recipe whose loss
    compiles with the model, the loss), with its floats `floats`, and train one step."""
    device = resolve_device(s.device)
    torch.manual_seed(0)
    model, family = build(s, s.experiments[label])
    model = model.to(device).train()
    recipe, batch = step_of(s, model, family, device)
    step = DataParallelLoss(model, recipe, Workers(), find_unused_parameters=False)
    compile_model(model, s.mode, s.backend)
    step.compile(s.mode, s.backend)
    torch._dynamo.config.specialize_float = floats == "specialised"  # read at the first call, where dynamo compiles
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    counters.clear()
    synchronize(device)
    start = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16_autocast(s.precision, device)):
        loss, _, _ = step(batch, torch.Generator().manual_seed(0))
    loss.backward()
    optimizer.step()
    synchronize(device)
    return {"first_step_s": time.perf_counter() - start, "analyses": counters["aot_autograd"]["total"]}


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One model's medians per floats setting, its runs, and the speedup of specialising."""
    medians = {floats: statistics.median(r["first_step_s"] for r in runs[floats]) for floats in FLOATS}
    return {
        "first_step_s": {floats: significant(m, 3) for floats, m in medians.items()},
        "speedup": significant(medians["symbolic"] / medians["specialised"], 3),
        "analyses": {floats: sorted({r["analyses"] for r in runs[floats]}) for floats in FLOATS},
        "runs_s": {floats: [significant(r["first_step_s"], 3) for r in runs[floats]] for floats in FLOATS},
    }


def main(argv: list[str] | None = None) -> Path | None:
    parser = benchmark_parser(__doc__, "benchmarks/configs/cold-compile.yaml")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a model label: one first step in this process
    parser.add_argument("--floats", choices=FLOATS, help=argparse.SUPPRESS)
    parser.add_argument("--child-report", type=Path, help=argparse.SUPPRESS)
    args, reproduce, s = parse_run(parser, argv, __name__, load_settings)
    if args.child:
        args.child_report.write_text(json.dumps(first_step(s, args.child, args.floats)))
        return None
    check_result_template(s.result_name)  # before minutes of compiling, not after
    device = resolve_device(s.device)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {label: {f: [] for f in FLOATS} for label in s.experiments}
    for repeat in range(s.repeats):
        for label in s.experiments:
            order = FLOATS if repeat % 2 == 0 else FLOATS[::-1]  # neither always runs first on a warming machine
            for floats in order:
                child = ["--child", label, "--floats", floats]  # `first_step` in a process of its own
                runs[label][floats].append(child_report(reproduce, child, s.child_timeout_s))
        print(f"repeat {repeat + 1}/{s.repeats}: " + "; ".join(
            f"{label} {runs[label]['specialised'][-1]['first_step_s']:.1f} s vs "
            f"{runs[label]['symbolic'][-1]['first_step_s']:.1f} s" for label in s.experiments))  # fmt: skip
    result = {
        "device": str(device),
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
        "bf16_autocast": use_bf16_autocast(s.precision, device),
        "models": {label: summarise(model_runs) for label, model_runs in runs.items()},
        "settings": asdict(s),
        **provenance(),
    }
    path = write_result(result_name_for(s.result_name, device.type), result, args.results_dir, reproduce)
    print(f"-> {path}")
    return path


if __name__ == "__main__":
    main()
