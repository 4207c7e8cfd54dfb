"""Kernel benchmark: the Triton HSTU attention against torch.compile of its TORCH backend, and one HSTU training step
with either; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.kernels.hstu_attention   # on a CUDA GPU
    .venv/bin/python -m benchmarks.kernels.hstu_attention --config benchmarks/configs/kernels-hstu-attention-smoke.yaml
        # tiny sizes; on CPU in Triton's interpreter, the TORCH backend eager
    .venv/bin/python -m benchmarks.kernels.hstu_attention --set 'cases=[]'   # the training step only

Settings: benchmarks/configs/kernels-hstu-attention.yaml (`--config`, `--set KEY=VALUE`).

Attention cases (bf16; S sequences, the longest L = the position-bias width, H heads, E head dim): forward and
forward + backward (gradients of q, k, v and the bias tables) at S=128, L=200 and S=32, L=1024 (H=2, E=64), every
sequence of length L ("full") or of lengths uniform in [L/2, L] ("jagged", seeded), and one with time buckets.
q, k, v are strided chunks of one (N, 4*H*E) tensor, as the model's linear output gives them. Ours =
`hstu_attention(kernel=TRITON)`; torch = `torch.compile` of `hstu_attention(kernel=TORCH)` (sequences padded to L,
one dense masked computation). Before timing, each case checks the Triton result (output and gradients) against
torch's on the case itself.

Training step: one HSTU step (NextItemRecipe loss, backward, Adam; bf16 autocast on CUDA) at the Beauty shape of
configs/beauty/hstu.yaml, the same model and batch with `attention_kernel: torch` and `triton`.

Times are `triton.testing.do_bench` medians (L2 flushed between runs) on CUDA, perf_counter medians on CPU.
TFLOP/s = the matmul flops of the causal pairs (the same count for both; torch's padding and masked work is not
counted) / time; GB/s = the bytes of q, k, v, the output and their gradients / time. Writes
benchmarks/results/kernels-hstu-attention-<gpu>.json (`-smoke` appended for a `smoke: true` config), with the
settings and how to reproduce it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from benchmarks.common import benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from benchmarks.kernels.embedding_bag import cpu_timer_mismatch, kernel_device, make_timer, result_head
from benchmarks.kernels.training_step import make_batch
from benchmarks.reproduce import jsonable
from recsys.models.hstu import HSTU, HSTUConfig
from recsys.ops.hstu_attention import Kernel, hstu_attention
from recsys.training.recipes import NextItemRecipe

Timer = Callable[[Callable[[], Any]], float]
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
TOLERANCE = {"bfloat16": 2e-2, "float32": 1e-4}  # of the largest torch value: |ours - torch| / max |torch|


@dataclass(frozen=True)
class AttentionCase:
    """One jagged batch: S sequences of at most L tokens, H heads of E dims."""

    name: str
    num_seqs: int  # S
    seq_len: int  # L, the longest sequence and the position-bias width (the model's max_history)
    heads: int  # H
    head_dim: int  # E
    lengths: Literal["full", "jagged"]  # full: every sequence L tokens; jagged: uniform in [L/2, L]
    time_buckets: int  # K time-bias columns; 0 = positions only


@dataclass(frozen=True)
class StepCase:
    """One HSTU training step's model and batch shape (full softmax over the catalog)."""

    name: str
    num_items: int  # V
    dim: int  # D
    num_heads: int
    num_layers: int
    rows: int  # packed rows per batch
    max_history: int  # the model's window = the packed row width


@dataclass(frozen=True)
class Settings:
    """What the benchmark measures (benchmarks/configs/kernels-hstu-attention*.yaml)."""

    # a quick check, not a measurement: it may run on CPU (Triton's interpreter) and its result is named `-smoke`
    smoke: bool
    compile_torch: bool  # torch.compile the TORCH backend (the smoke run leaves it eager: compiling takes minutes)
    dtype: Literal["bfloat16", "float32"]  # of q, k, v (the bias tables stay fp32, as the model's parameters)
    seed: int  # the jagged lengths, inputs and batches
    cpu_repeats: int  # on CPU, timed runs per step (median, after one warm-up); on CUDA do_bench decides
    cases: tuple[AttentionCase, ...]
    steps: tuple[StepCase, ...]


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


# ------------------------------------------------------------------------------------------------ the inputs


@dataclass
class Problem:
    """One case's inputs in the op's layout; q, k, v are chunks of `qkvu`."""

    qkvu: torch.Tensor  # (N, 4*H*E), requires grad
    offsets: torch.Tensor  # (S+1,) int64
    position_bias: torch.Tensor  # (H, L) fp32, requires grad
    time_bias: torch.Tensor | None  # (H, K) fp32, requires grad
    timestamps: torch.Tensor | None  # (N,) int64
    query_times: torch.Tensor | None  # (N,) int64
    grad_out: torch.Tensor  # (N, H, E)

    def leaves(self) -> list[torch.Tensor]:
        return [self.qkvu, self.position_bias, *([] if self.time_bias is None else [self.time_bias])]


def sequence_lengths(c: AttentionCase, generator: torch.Generator) -> torch.Tensor:
    """(S,) lengths: all L, or uniform in [L/2, L] with the first one L (so every case reaches L)."""
    if c.lengths == "full":
        return torch.full((c.num_seqs,), c.seq_len)
    lengths = torch.randint(c.seq_len // 2, c.seq_len + 1, (c.num_seqs,), generator=generator)
    lengths[0] = c.seq_len
    return lengths


def make_problem(c: AttentionCase, dtype: torch.dtype, seed: int, device: torch.device) -> Problem:
    gen = torch.Generator().manual_seed(seed)
    lengths = sequence_lengths(c, gen)
    n = int(lengths.sum())

    def leaf(t: torch.Tensor) -> torch.Tensor:
        return t.to(device).requires_grad_()

    # q, k of unit variance would give scores of std sqrt(E): scaled to std 1, as trained models keep them
    qkvu = leaf((torch.randn(n, 4 * c.heads * c.head_dim, generator=gen) / c.head_dim**0.25).to(dtype))
    problem = Problem(
        qkvu, torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(device),
        leaf(torch.randn(c.heads, c.seq_len, generator=gen) * 0.1), None, None, None,
        torch.randn(n, c.heads, c.head_dim, generator=gen).to(dtype).to(device),
    )  # fmt: skip
    if c.time_buckets:
        timestamps = torch.randint(0, 2**40, (n,), generator=gen)
        gaps = (2.0 ** (torch.rand(n, generator=gen) * 30)).long()  # 1 s to ~34 years, log-uniform
        problem.time_bias = leaf(torch.randn(c.heads, c.time_buckets, generator=gen) * 0.1)
        problem.timestamps, problem.query_times = timestamps.to(device), (timestamps + gaps).to(device)
    return problem


def attention(kernel: Kernel, c: AttentionCase) -> Callable[..., torch.Tensor]:
    """(qkvu, offsets, position_bias, time_bias, timestamps, query_times) -> (N, H, E) with `kernel`."""

    def attend(
        qkvu: torch.Tensor,
        offsets: torch.Tensor,
        position_bias: torch.Tensor,
        time_bias: torch.Tensor | None,
        timestamps: torch.Tensor | None,
        query_times: torch.Tensor | None,
    ) -> torch.Tensor:
        shape = (qkvu.shape[0], c.heads, c.head_dim)  # (N, H, E)
        _, v, q, k = (t.view(shape) for t in qkvu.chunk(4, dim=-1))  # strided views, as in the model
        return hstu_attention(
            q, k, v, offsets, max_len=c.seq_len, position_bias=position_bias, time_bias=time_bias,
            timestamps=timestamps, query_times=query_times, max_seq_len=c.seq_len, kernel=kernel,
        )  # fmt: skip

    return attend


def steps_of(fn: Callable[..., torch.Tensor], p: Problem) -> dict[str, Callable[[], Any]]:
    """{"fwd": forward, "fwd_bwd": forward + the gradients of every leaf (autograd.grad: nothing accumulates)}."""

    def fwd() -> torch.Tensor:
        return fn(p.qkvu, p.offsets, p.position_bias, p.time_bias, p.timestamps, p.query_times)

    def fwd_bwd() -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(fwd(), p.leaves(), p.grad_out)

    return {"fwd": fwd, "fwd_bwd": fwd_bwd}


# ------------------------------------------------------------------------------------------ work per case


def causal_pairs(p: Problem) -> int:
    """(query, key) pairs of the same sequence with key <= query, summed over the sequences."""
    lengths = p.offsets.diff().double()
    return int((lengths * (lengths + 1) / 2).sum())


def flops(c: AttentionCase, p: Problem, step: str) -> int:
    """Matmul flops (2 per multiply-add) on the causal pairs: forward q.k and a.v; backward dv, da, dk, dq."""
    per_pair = 2 * c.head_dim * c.heads
    return per_pair * causal_pairs(p) * (2 if step == "fwd" else 6)


def bytes_moved(c: AttentionCase, p: Problem, step: str) -> int:
    """q, k, v read and the output written (forward); + the output gradient and q, k, v read again and their
    gradients written (backward). The bias tables, offsets and times are small and not counted."""
    tensor = p.qkvu.shape[0] * c.heads * c.head_dim * p.qkvu.element_size()  # one (N, H, E) tensor
    return tensor * (4 if step == "fwd" else 11)


# ------------------------------------------------------------------------------------------------ checking


def relative_errors(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> list[float]:
    """max |ours - theirs| / max |theirs| per tensor."""
    return [
        float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-30))
        for a, b in zip(ours, theirs, strict=True)
    ]


def check(
    ours: dict[str, Callable[[], Any]], theirs: dict[str, Callable[[], Any]], p: Problem, dtype: str
) -> dict[str, float]:
    """Assert the Triton output and gradients equal torch's within the dtype's tolerance; the relative errors."""
    names = ["out", "qkvu", "position_bias", *([] if p.time_bias is None else ["time_bias"])]
    ours_out, theirs_out = ours["fwd"]().detach(), theirs["fwd"]().detach()
    errors = relative_errors([ours_out, *ours["fwd_bwd"]()], [theirs_out, *theirs["fwd_bwd"]()])
    bad = {name: error for name, error in zip(names, errors, strict=True) if not error <= TOLERANCE[dtype]}
    if bad:
        raise AssertionError(f"the Triton result differs from torch's beyond {TOLERANCE[dtype]} (relative): {bad}")
    return {name: significant(error, 3) for name, error in zip(names, errors, strict=True)}


# -------------------------------------------------------------------------------------------------- timing


def run_case(c: AttentionCase, s: Settings, device: torch.device, timer: Timer) -> dict[str, Any]:
    p = make_problem(c, DTYPES[s.dtype], s.seed, device)
    torch_fn = attention(Kernel.TORCH, c)
    ours = steps_of(attention(Kernel.TRITON, c), p)
    theirs = steps_of(torch.compile(torch_fn, dynamic=False) if s.compile_torch else torch_fn, p)
    checked = check(ours, theirs, p, s.dtype)  # autotunes the kernels and compiles torch's too
    result: dict[str, Any] = {**asdict(c), "tokens": p.qkvu.shape[0], "causal_pairs": causal_pairs(p)}
    for step in ("fwd", "fwd_bwd"):
        ms, torch_ms = timer(ours[step]), timer(theirs[step])
        work, moved = flops(c, p, step), bytes_moved(c, p, step)
        result[step] = {
            "ms": significant(ms),
            "torch_ms": significant(torch_ms),
            "ratio_vs_torch": significant(torch_ms / ms),
            "flops": work,
            "TFLOPs": significant(work / (ms * 1e9)),
            "torch_TFLOPs": significant(work / (torch_ms * 1e9)),
            "bytes": moved,
            "GBps": significant(moved / (ms * 1e6)),
        }
    result["checked_relative_error"] = checked
    del p, ours, theirs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def make_train_step(c: StepCase, kernel: Literal["torch", "triton"], device: torch.device, seed: int) -> Any:
    """A closure running one training step of a fresh model (same seed and batch for both kernels)."""
    torch.manual_seed(seed)
    config = HSTUConfig(
        num_items=c.num_items, max_history=c.max_history, dim=c.dim, num_layers=c.num_layers, num_heads=c.num_heads,
        attention_kernel=kernel,
    )  # fmt: skip
    model = HSTU(config).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    recipe = NextItemRecipe(c.max_history, c.rows)
    generator = torch.Generator().manual_seed(seed)
    batch = make_batch(c.num_items, c.rows, c.max_history, generator).to(device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss, _ = recipe.loss(model, batch, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def run_step(c: StepCase, s: Settings, device: torch.device, timer: Timer) -> dict[str, Any]:
    times = {kernel: timer(make_train_step(c, kernel, device, s.seed)) for kernel in ("torch", "triton")}
    return {
        **asdict(c),
        "torch_ms": significant(times["torch"]),
        "triton_ms": significant(times["triton"]),
        "ratio_vs_torch": significant(times["torch"] / times["triton"]),
    }


# ------------------------------------------------------------------------------------------------ the CLI


def print_tables(cases: list[dict[str, Any]], steps: list[dict[str, Any]]) -> None:
    header = (
        f"{'case':<22} {'step':<8} {'ms':>9} {'TFLOP/s':>8} {'GB/s':>7} {'torch ms':>9} {'torch TF/s':>10} "
        f"{'x torch':>7}"
    )
    print(header)
    print("-" * len(header))
    for r in cases:
        for step in ("fwd", "fwd_bwd"):
            t = r[step]
            print(
                f"{r['name']:<22} {step:<8} {t['ms']:>9.3f} {t['TFLOPs']:>8.2f} {t['GBps']:>7,.0f} "
                f"{t['torch_ms']:>9.3f} {t['torch_TFLOPs']:>10.2f} {t['ratio_vs_torch']:>7.2f}"
            )
    for r in steps:
        print(f"training step {r['name']}: torch {r['torch_ms']:.3f} ms, triton {r['triton_ms']:.3f} ms, "
              f"x{r['ratio_vs_torch']:.2f}")  # fmt: skip


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/kernels-hstu-attention.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    device = kernel_device(settings.smoke, "benchmarks/configs/kernels-hstu-attention-smoke.yaml")

    timer, timer_note = make_timer(device, settings.cpu_repeats)
    cases = []
    for c in settings.cases:
        cases.append(run_case(c, settings, device, timer))
        print(f"  {c.name}: fwd+bwd {cases[-1]['fwd_bwd']['ms']:.3f} ms, x{cases[-1]['fwd_bwd']['ratio_vs_torch']:.2f}")
    steps = [run_step(c, settings, device, timer) for c in settings.steps]
    name, head = result_head(device, "kernels-hstu-attention", settings.smoke)
    torch_impl = "torch.compile(hstu_attention(kernel=TORCH))" if settings.compile_torch else "eager TORCH backend"
    result = {
        **head,
        "timer": timer_note,
        "torch_impl": torch_impl,
        "notes": {
            "TFLOPs": "matmul flops of the causal pairs (fwd: q.k, a.v; bwd: dv, da, dk, dq; 2 per multiply-add) / "
            "median time, the same count for both implementations",
            "GBps": "bytes of q, k, v and the output (fwd; + their gradients and the output gradient for fwd_bwd) / "
            "median time",
            "ratio_vs_torch": "torch_ms / ms: above 1 means the Triton kernel (or step) is faster",
            "checked_relative_error": "max |triton - torch| / max |torch| per tensor, before timing",
            "step": "HSTU NextItemRecipe loss + backward + Adam step; bf16 autocast on CUDA",
        },
        "settings": asdict(settings),
        "cases": cases,
        "steps": steps,
        **provenance("triton"),
    }
    path = write_result(name, result, args.results_dir, reproduce)
    print_tables(cases, steps)
    print(f"-> {path}")
    return path


def recorded_mismatches(result: dict[str, Any], settings: Settings) -> Iterator[str]:
    """What the result records of its settings (all of them, its smoke flag and CPU timer, every case's and step's
    shape) that differs from `settings`."""
    recorded = result.get("settings", {})
    for key, value in jsonable(asdict(settings)).items():
        if recorded.get(key, "<absent>") != value:
            yield f"settings.{key}: the result has {recorded.get(key, '<absent>')!r}, the config {value!r}"
    if result.get("smoke") != settings.smoke:
        yield f"smoke: the result has {result.get('smoke')!r}, the config {settings.smoke!r}"
    yield from cpu_timer_mismatch(result.get("timer"), settings.cpu_repeats)
    for section, expected in (("cases", settings.cases), ("steps", settings.steps)):
        names = [entry.get("name") for entry in result.get(section, [])]
        if names != [c.name for c in expected]:
            yield f"{section}: the result has {names}, the config {[c.name for c in expected]}"
        for entry, c in zip(result.get(section, []), expected, strict=False):
            for key, value in asdict(c).items():
                if entry.get(key) != value:
                    yield f"{section}[{c.name}].{key}: the result has {entry.get(key)!r}, the config {value!r}"


if __name__ == "__main__":
    main()
