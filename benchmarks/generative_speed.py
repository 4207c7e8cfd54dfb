"""Generative retriever training speed: seconds per training epoch and per validation pass at Beauty size, and where a
step's time goes (torch.profiler); writes JSON.

Usage:
    .venv/bin/python -m benchmarks.generative_speed --set device=cuda  # benchmarks/configs/beauty-generative-speed.yaml
    .venv/bin/python -m benchmarks.generative_speed --config benchmarks/configs/generative-speed-smoke.yaml  # seconds

The config names an experiment config (the model and its training settings), its data and the `variants` to time:
"eager" (`train.hardware.compile: false`) or a torch.compile mode (`compile: true`, `compile_mode`: "default",
"reduce-overhead" replays CUDA graphs, ...). For each, in one process one after the other, the experiment's pipeline
runs until its train step (prepare, content embeddings, semantic IDs: built once, reused) with `epochs` epochs, each
validated, so that `seconds_per_epoch` (the median epoch's training part: the first epoch's compilation does not
count once there are three or more) and `valid_seconds_per_epoch` (one validation pass: beam search over every
validation user) are the trainer's own figures. With `profile`, one more epoch of the fastest variant is trained with
`profile_steps` of its steps under torch.profiler: the operators with the most device time and the most host time,
the device's busy share of those steps' wall time (a step that leaves the device idle is bound by the host: launches,
synchronisations, Python), and the graphs and graph breaks torch.compile made.

How long a run waits before it trains: each variant's `time_to_first_step_s` and `time_to_first_validation_s` (the
trainer's, from the start of training: compiling included) are cold figures, the benchmark compiling into an inductor
cache of its own, empty, and without the compile cache of an earlier run. With `warm_start`, the fastest compiled
variant then trains one epoch again in a process of its own, with an empty inductor cache too, so that only the compile
cache the timed run left beside its model (`train.hardware.compile_cache`) can spare it the compiling: its figures and
its compile-cache hits and misses are `warm_start`.

Beam search's precision (`model.params.beam_precision`): the fastest variant's trained model ranks the validation
users twice per entry of `beam_precisions` (eager, the same weights), before the warm start retrains that model:
each one's seconds (the second pass; `first_pass_seconds` the first) and metrics (`beam_precision`), so bf16 is used
where it keeps the fp32 figures and saves time.

Writes benchmarks/results/<result_name>.json with the machine (GPU named), versions and how to reproduce it: after
the timed runs and again after each later phase, so a run stopped part way (a time limit) keeps what it measured;
`unfinished` lists the phases still to run until the last one is in.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch._dynamo.utils import counters
from torch.autograd import DeviceType
from torch.optim.optimizer import register_optimizer_step_post_hook

from benchmarks.common import (
    INDUCTOR_CACHE,
    REPO,
    Reproduce,
    benchmark_parser,
    child_report,
    parse_run,
    provenance,
    settings_from,
    significant,
    synchronize,
    write_result,
)
from benchmarks.quality import work_overrides
from pipelines.config import ExperimentConfig, load_config
from pipelines.runner import run_pipeline
from pipelines.steps.base import ExperimentPaths
from pipelines.train import compile_cache_path
from recsys.artifacts.model_dir import load_model_dir
from recsys.data.splits import VALID
from recsys.evaluation import evaluate
from recsys.runtime.device import resolve_device, use_bf16_autocast
from recsys.training.config import CompileMode

Variant = Literal["eager"] | CompileMode  # eager: train.hardware.compile false; else compile true in that mode


@dataclass(frozen=True)
class Settings:
    """What the benchmark measures (benchmarks/configs/beauty-generative-speed.yaml)."""

    experiment: str  # an experiment config in the repo: the generative model and its training
    data_path: str | None  # the raw data the experiment reads (None: a generated source, e.g. synthetic)
    result_name: str
    device: str = "cuda"  # the training device (train.hardware.device)
    epochs: int = 5  # timed epochs, each validated; the median is reported
    variants: tuple[Variant, ...] = ("default",)
    profile: bool = True  # one more epoch of the fastest variant, some of its steps under torch.profiler
    warm_start: bool = True  # the fastest compiled variant's first step again, in a new process, from its cache
    beam_precisions: tuple[Literal["fp32", "bf16"], ...] = ("fp32", "bf16")  # validation ranked in each; () = none
    profile_after: int = 100  # steps of that epoch before the profiled ones (the compilation happens in the first)
    profile_steps: int = 50
    top_ops: int = 20  # operators listed per profile table
    work_dir: str = ".cache/bench-generative-speed"
    experiment_overrides: dict[str, Any] = field(default_factory=dict)  # dotted overrides of the experiment


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def experiment(s: Settings, work: Path, epochs: int, variant: str) -> ExperimentConfig:
    """The experiment config trained for `epochs` epochs, each validated, on `s.device` as `variant` says, tracked in
    `work`."""
    compiled = {"train.hardware.compile": False} if variant == "eager" else {
        "train.hardware.compile": True, "train.hardware.compile_mode": variant}  # fmt: skip
    timing = {
        **({} if s.data_path is None else {"data.path": s.data_path}),
        **compiled,
        "train.hardware.device": s.device,
        "train.schedule.epochs": epochs,
        "train.schedule.eval_every": 1,
        "train.schedule.patience": epochs + 1,  # time every epoch: no early stop
    }
    return load_config(REPO / s.experiment, {**timing, **s.experiment_overrides, **work_overrides(work)})


def timed_run(s: Settings, work: Path, variant: str, epochs: int | None = None, cold: bool = True) -> dict[str, Any]:
    """Train `epochs` (default `s.epochs`) epochs afresh as `variant`: the trainer's seconds per epoch and per
    validation pass, and its time to the first step and validation; `cold`: without an earlier run's compile cache."""
    config = experiment(s, work, epochs or s.epochs, variant)
    cache = compile_cache_path(ExperimentPaths.under(work, config).model_dir, config)
    if cold and cache is not None:
        cache.unlink(missing_ok=True)
    outputs = run_pipeline(config, work, until="train_retriever", rerun=["train_retriever"])[0]
    assert outputs.model is not None
    m = outputs.model.metrics
    return {
        "seconds_per_epoch": significant(m["seconds_per_epoch"]),
        "valid_seconds_per_epoch": significant(m.get("valid_seconds_per_epoch", 0.0)),
        "train_seconds": significant(m["train_seconds"]),
        "time_to_first_step_s": significant(m["time_to_first_step_s"]),
        "time_to_first_validation_s": significant(m["time_to_first_validation_s"]),
        "epochs": m["epochs_run"],
        "valid": m["valid"],
        "model_dir": str(outputs.model.model_dir),
    }


def beam_precision(s: Settings, work: Path, variant: str, model_dir: Path) -> dict[str, Any]:
    """The trained model of `model_dir` ranking the validation users once per `s.beam_precisions` entry (eager):
    each one's seconds and metrics."""
    trained, device = load_model_dir(model_dir), resolve_device(s.device)
    model, valid = trained.model.to(device).eval(), trained.data.eval_split(VALID)
    eval_config = experiment(s, work, 1, variant).eval
    ranked: dict[str, Any] = {}
    for precision in s.beam_precisions:
        model.config = dataclasses.replace(model.config, beam_precision=precision)
        seconds = []
        for _ in range(2):  # the first pass pays the precision's one-off costs (kernel choice, autocast caches)
            synchronize(device)
            start = time.perf_counter()
            metrics = evaluate(model, valid, trained.data.num_items, eval_config, what=f"validation, {precision} beams")
            synchronize(device)
            seconds.append(time.perf_counter() - start)
        ranked[precision] = {"seconds": significant(seconds[-1]), "first_pass_seconds": significant(seconds[0]),
                             **metrics.metrics}  # fmt: skip
    return ranked


@contextlib.contextmanager
def _own_inductor_cache() -> Iterator[None]:
    """A block whose compilations use an empty inductor cache directory of their own (removed after it)."""
    before = os.environ.get(INDUCTOR_CACHE)
    with tempfile.TemporaryDirectory(prefix="inductor-") as inductor:
        os.environ[INDUCTOR_CACHE] = inductor
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(INDUCTOR_CACHE, None)
            else:
                os.environ[INDUCTOR_CACHE] = before


def warm_start(reproduce: Reproduce, variant: str) -> dict[str, Any]:
    """`variant` trained one epoch again in a new process whose inductor cache is empty: what the compile cache of
    the timed run alone saves (its time to the first step and validation, and inductor's cache hits and misses)."""
    return {"variant": variant, **child_report(reproduce, ["--warm-start-child", variant], timeout_s=3600)}


def profiled_run(s: Settings, work: Path, variant: str) -> dict[str, Any]:
    """`s.profile_steps` training steps of one more epoch under torch.profiler, after `s.profile_after` steps (past
    the compilation): top operators by device and host time, the device's busy share of those steps' wall time, and
    the graphs and graph breaks torch.compile made in the whole epoch. The profiler steps with the trainer's optimizer
    (a global step hook), so only training steps are recorded."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if resolve_device(s.device).type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    schedule = torch.profiler.schedule(wait=s.profile_after, warmup=2, active=s.profile_steps, repeat=1)
    stepped: list[float] = []  # perf_counter after each optimizer step
    counters.clear()
    with torch.profiler.profile(activities=activities, schedule=schedule) as profiler:

        def next_step(*_: Any) -> None:
            stepped.append(time.perf_counter())
            profiler.step()

        hook = register_optimizer_step_post_hook(next_step)
        try:
            run_pipeline(experiment(s, work, 1, variant), work, until="train_retriever", rerun=["train_retriever"])
        finally:
            hook.remove()
    first = s.profile_after + 2  # the profiler's step number of the first active step
    if len(stepped) < first + s.profile_steps:
        raise SystemExit(
            f"an epoch has {len(stepped)} steps, fewer than profile_after + 2 + profile_steps = "
            f"{first + s.profile_steps}. Fix: lower profile_after or profile_steps"
        )
    wall = stepped[first + s.profile_steps - 1] - stepped[first - 1]
    events = profiler.key_averages()
    # the kernels' own time (an operator's device time is its kernels': counted once, at the kernels); a named range
    # (the optimizer's step, a compiled graph's call) is mirrored on the device's timeline over its kernels: left out
    kernels = [e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    busy = sum(event.self_device_time_total for event in kernels) / 1e6
    return {
        "variant": variant,
        "steps": s.profile_steps,
        "ms_per_step": significant(1e3 * wall / s.profile_steps),
        "device_busy_ms_per_step": significant(1e3 * busy / s.profile_steps),
        "device_busy_share": significant(busy / wall),
        "graphs_compiled": counters["stats"]["unique_graphs"],
        "graph_breaks": dict(counters["graph_break"]),
        "top_device_ops": op_table(events, "self_device_time_total", s.top_ops),
        "top_host_ops": op_table(events, "self_cpu_time_total", s.top_ops),
    }


def op_table(events: Any, key: str, top: int) -> list[dict[str, Any]]:
    """The `top` operators by `key` (a profiler event's self time, microseconds): name, calls, self ms on each side."""
    operators = [event for event in events if not event.key.startswith("ProfilerStep")]  # the steps themselves
    ranked = sorted(operators, key=lambda event: getattr(event, key), reverse=True)[:top]
    return [
        {
            "name": event.key[:120],
            "calls": event.count,
            "self_device_ms": significant(event.self_device_time_total / 1e3),
            "self_host_ms": significant(event.self_cpu_time_total / 1e3),
        }
        for event in ranked
    ]


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/beauty-generative-speed.yaml")
    parser.add_argument("--warm-start-child", metavar="VARIANT", help=argparse.SUPPRESS)  # `warm_start`'s process
    parser.add_argument("--child-report", type=Path, help=argparse.SUPPRESS)
    args, reproduce, s = parse_run(parser, argv, __name__, load_settings)
    work = (REPO / s.work_dir).resolve()
    if args.warm_start_child:
        counters.clear()
        run = timed_run(s, work, args.warm_start_child, epochs=1, cold=False)
        hits = {key: value for key, value in counters["inductor"].items() if key.startswith("fxgraph_cache")}
        args.child_report.write_text(json.dumps({**run, "inductor_cache": hits}))
        return args.child_report
    device = resolve_device(s.device)
    with _own_inductor_cache():  # cold: nothing compiled before, by this process or another
        timed = {variant: timed_run(s, work, variant) for variant in s.variants}
    fastest = min(timed, key=lambda variant: timed[variant]["seconds_per_epoch"])
    compiled = [variant for variant in s.variants if variant != "eager"]
    fastest_compiled = min(compiled, key=lambda variant: timed[variant]["seconds_per_epoch"], default=None)
    # the phases after the timed runs, in order (the beam precisions before the warm start, which trains the same
    # model directory again for one epoch); each fills its key, None where the settings leave it out
    phases: dict[str, Callable[[], dict[str, Any]] | None] = {
        "beam_precision": (
            (lambda: beam_precision(s, work, fastest, Path(timed[fastest]["model_dir"]))) if s.beam_precisions else None
        ),
        "warm_start": (lambda: warm_start(reproduce, fastest_compiled)) if s.warm_start and fastest_compiled else None,
        "profile": (lambda: profiled_run(s, work, fastest)) if s.profile else None,
    }
    result: dict[str, Any] = {
        "experiment": s.experiment,
        "experiment_overrides": s.experiment_overrides,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "bf16_autocast": use_bf16_autocast(experiment(s, work, 1, fastest).train.hardware.precision, device),
        "variants": timed,
        "fastest": fastest,
        "seconds_per_epoch": timed[fastest]["seconds_per_epoch"],
        "valid_seconds_per_epoch": timed[fastest]["valid_seconds_per_epoch"],
        "time_to_first_step_s": timed[fastest]["time_to_first_step_s"],
        **dict.fromkeys(phases),
        **provenance(),
    }
    # written after the timed runs and after each phase, so a run stopped part way keeps what it measured; the
    # phases still to run are listed under "unfinished" until the last one is in
    unfinished = {phase: measure for phase, measure in phases.items() if measure is not None}

    def save() -> Path:
        return write_result(s.result_name, {**result, **({"unfinished": [*unfinished]} if unfinished else {})},
                            args.results_dir, reproduce)  # fmt: skip

    path = save()
    for phase, measure in list(unfinished.items()):
        result[phase] = measure()
        del unfinished[phase]
        path = save()
    for variant, times in timed.items():
        print(f"{s.experiment} {variant}: {times['seconds_per_epoch']:.2f} s/epoch, "
              f"{times['valid_seconds_per_epoch']:.2f} s/valid, "
              f"first step after {times['time_to_first_step_s']:.1f} s")  # fmt: skip
    if result["warm_start"]:
        print(f"warm start ({result['warm_start']['variant']}, from the compile cache): first step after "
              f"{result['warm_start']['time_to_first_step_s']:.1f} s")  # fmt: skip
    print(f"-> {path}")
    return path


if __name__ == "__main__":
    main()
