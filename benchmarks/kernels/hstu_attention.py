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
torch's on the case itself, and `tuned` records the config each Triton kernel's autotuner chose for it.

With `peer_checkout` (a checkout of Meta generative-recommenders at `peer_commit`), its Triton HSTU attention
(`triton_hstu_mha`: no relative biases) is timed on every case too, each in a process of its own
(`benchmarks.kernels.hstu_attention_peer`: a faulting peer loses its own timings, not the run). A case with
`compare_torch: false` (shapes whose padded dense scores would not fit, e.g. 64 x 4096 x 4 heads) times
ours alone, checked first against the eager TORCH backend on two sequences of the same shape. `sdpa_backends`
(cudnn, flash) time torch's scaled_dot_product_attention with that backend on the same case padded to (S, H, L, E),
causal, as the hardware anchor: standard softmax attention, the fastest kernels of its kind; a backend that cannot
run the case, or a run without CUDA, is recorded as such.

Training step: one HSTU step (NextItemRecipe loss, backward, Adam; bf16 autocast on CUDA) at the Beauty shape of
configs/beauty/hstu.yaml, the same model and batch with `attention_kernel: torch` and `triton`.

Times are `triton.testing.do_bench` medians (L2 flushed between runs) on CUDA, perf_counter medians on CPU.
TFLOP/s = the matmul flops of the causal pairs (the same count for both; torch's padding and masked work is not
counted) / time; GB/s = the bytes of q, k, v, the output and their gradients / time. Writes
benchmarks/results/<result_name>.json (default kernels-hstu-attention-{device}: `{device}` the GPU's short name;
`-smoke` appended for a `smoke: true` config), with the settings and how to reproduce it. A run of one case (a long
one may need a device call of its own) names its result after it:
    --set "cases=[<the case>]" --set "result_name=kernels-hstu-attention-{device}-<case>"
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from benchmarks.common import REPO, benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from benchmarks.kernels.embedding_bag import cpu_timer_mismatch, kernel_device, make_timer, result_head
from benchmarks.kernels.training_step import make_batch
from benchmarks.reproduce import field_defaults, jsonable
from recsys.errors import ConfigError
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
    # False: ours alone (torch's padded dense scores would not fit), checked against eager torch on 2 sequences
    compare_torch: bool = True


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
    # torch's scaled_dot_product_attention backends timed on every case as the anchor (CUDA only)
    sdpa_backends: tuple[Literal["cudnn", "flash"], ...] = ()
    # Meta generative-recommenders' Triton HSTU attention, from a checkout of `peer_commit` (docs/kernels.md says how
    # to make one), timed on every case in a process of its own (`benchmarks.kernels.hstu_attention_peer`)
    peer_checkout: str | None = None
    peer_commit: str | None = None
    # benchmarks/results/<this>.json, `{device}` the GPU's short name (a run of one case: name it after the case)
    result_name: str = "kernels-hstu-attention-{device}"


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
    theirs = None
    if c.compare_torch:
        theirs = steps_of(torch.compile(torch_fn, dynamic=False) if s.compile_torch else torch_fn, p)
        checked = check(ours, theirs, p, s.dtype)  # autotunes the kernels and compiles torch's too
    else:  # the same shape on two sequences, against eager torch; then this case's own autotuning
        small = make_problem(dataclasses.replace(c, num_seqs=2), DTYPES[s.dtype], s.seed, device)
        checked = check(steps_of(attention(Kernel.TRITON, c), small), steps_of(torch_fn, small), small, s.dtype)
        del small
        ours["fwd_bwd"]()  # autotune at this case's shape before the timer's first (estimating) call
    result: dict[str, Any] = {**asdict(c), "tokens": p.qkvu.shape[0], "causal_pairs": causal_pairs(p)}
    for step in ("fwd", "fwd_bwd"):
        ms = timer(ours[step])
        work, moved = flops(c, p, step), bytes_moved(c, p, step)
        timing: dict[str, Any] = {
            "ms": significant(ms),
            "flops": work,
            "TFLOPs": significant(work / (ms * 1e9)),
            "bytes": moved,
            "GBps": significant(moved / (ms * 1e6)),
        }
        if device.type == "cuda":
            timing["gpu"] = gpu_time(ours[step], ms)
            timing["graphed_ms"] = significant(timer(graphed(ours[step])))
        if theirs is not None:
            torch_ms = timer(theirs[step])
            timing |= {
                "torch_ms": significant(torch_ms),
                "ratio_vs_torch": significant(torch_ms / ms),
                "torch_TFLOPs": significant(work / (torch_ms * 1e9)),
            }
        result[step] = timing
    result["tuned"] = tuned_configs()
    result["checked_relative_error"] = checked
    result["checked_on"] = "this case" if c.compare_torch else "2 sequences of this shape, eager torch"
    del p, ours, theirs
    if device.type == "cuda":
        torch.cuda.empty_cache()
    if s.peer_checkout is not None:
        for step, timing in peer_timings(c, s, device).items():
            if "ms" in timing:
                timing["ours_time_over_peer"] = significant(result[step]["ms"] / timing["ms"])
            result[step]["peer"] = timing
    if s.sdpa_backends:
        anchors = sdpa_anchors(c, s, device, timer)
        for step in ("fwd", "fwd_bwd"):
            for timing in anchors[step].values():
                if "ms" in timing:
                    timing["ours_time_over_sdpa"] = significant(result[step]["ms"] / timing["ms"])
            result[step]["sdpa"] = anchors[step]
    return result


def tuned_configs() -> dict[str, dict[str, Any]]:
    """Each autotuned Triton kernel's config of its last call (the case just timed): blocks, TMA (the forward's
    loads through tensor descriptors), warps and stages."""
    from recsys.ops.triton.hstu_attention import AUTOTUNED_KERNELS

    return {
        tuner.fn.__name__: {**tuner.best_config.kwargs, "num_warps": tuner.best_config.num_warps,
                            "num_stages": tuner.best_config.num_stages}
        for tuner in AUTOTUNED_KERNELS
        if getattr(tuner, "best_config", None) is not None  # a kernel this case never launched
    }  # fmt: skip


def graphed(step: Callable[[], Any]) -> Callable[[], None]:
    """`step` captured in a CUDA graph (after warm-up calls on a side stream, as torch's capture rules ask), as the
    graph's replay: the call's time without the host's work (launches, Python), what a training step replaying CUDA
    graphs (torch.compile's reduce-overhead mode) pays for it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def gpu_time(step: Callable[[], Any], ms: float, calls: int = 5) -> dict[str, Any]:
    """The GPU's busy time per call of `step` by kernel (torch.profiler over `calls` calls) and its share of the
    timed `ms`: a share well under 1 means the call waits on host work (launches, Python), not on its kernels; the
    host's own time per call by operator (`host_ms`, self time: where that host work goes)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    events = prof.key_averages()
    # the GPU's own events only: with CPU activity on, the operators that launched them carry the same time again
    device = [e for e in events if e.device_type == DeviceType.CUDA]
    kernels = {e.key: e.self_device_time_total / calls / 1e3 for e in device if e.self_device_time_total}
    host = {e.key: e.self_cpu_time_total / calls / 1e3 for e in events if e.self_cpu_time_total}
    busy = sum(kernels.values())
    return {"busy_ms": significant(busy), "busy_share": significant(busy / ms), "kernels_ms": _top(kernels),
            "host_ms": _top(host)}  # fmt: skip


def _top(times_ms: dict[str, float], n: int = 6) -> dict[str, float]:
    return {name[:80]: significant(t) for name, t in sorted(times_ms.items(), key=lambda item: -item[1])[:n]}


PEER_FILE = "generative_recommenders/ops/triton/triton_hstu_attention.py"
PEER_TIMEOUT_S = 600  # one case's autotuning and timing of the peer, in its own process


def check_peer(s: Settings) -> None:
    """A configured peer checkout holds the peer's kernel, and names its commit."""
    if s.peer_checkout is None:
        return
    if not (REPO / s.peer_checkout / PEER_FILE).is_file() or not s.peer_commit:
        raise ConfigError(
            f"peer_checkout {s.peer_checkout!r} has no {PEER_FILE} (or peer_commit is unset). Fix: extract the pinned "
            "commit there (docs/kernels.md, 'HSTU attention'), or set peer_checkout: null"
        )


def peer_timings(c: AttentionCase, s: Settings, device: torch.device) -> dict[str, dict[str, Any]]:
    """{step: {ms, flops, TFLOPs} or {skipped | error: why}} of the peer kernel on case `c`, run in a child process."""
    steps = ("fwd", "fwd_bwd")
    if device.type != "cuda":
        return {step: {"skipped": "the peer's Triton kernel needs CUDA"} for step in steps}
    assert s.peer_checkout is not None
    command = [sys.executable, "-m", "benchmarks.kernels.hstu_attention_peer", str(REPO / s.peer_checkout),
               json.dumps(asdict(c)), s.dtype, str(s.seed)]  # fmt: skip
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=PEER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {step: {"error": f"no result within {PEER_TIMEOUT_S} s"} for step in steps}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1][:300]
        return {step: {"error": f"the peer's process exited with {done.returncode}: {last}"} for step in steps}
    timings: dict[str, dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return timings


SDPA_BACKENDS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION"}


def sdpa_anchors(c: AttentionCase, s: Settings, device: torch.device, timer: Timer) -> dict[str, dict[str, Any]]:
    """{step: {backend: {ms, flops, TFLOPs} or {skipped | error: why}}}: causal scaled_dot_product_attention of
    S x H x L x E (every sequence padded to L), timed with each of `s.sdpa_backends`."""
    out: dict[str, dict[str, Any]] = {"fwd": {}, "fwd_bwd": {}}
    if device.type != "cuda":
        for step in out:
            out[step] = {b: {"skipped": "SDPA's cudnn and flash backends need CUDA"} for b in s.sdpa_backends}
        return out
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device=device).manual_seed(s.seed)
    shape = (c.num_seqs, c.heads, c.seq_len, c.head_dim)
    q, k, v = (
        (torch.randn(shape, generator=gen, device=device) / c.head_dim**0.25).to(DTYPES[s.dtype]).requires_grad_()
        for _ in range(3)
    )
    grad_out = torch.randn(shape, generator=gen, device=device).to(DTYPES[s.dtype])
    pairs = c.num_seqs * c.seq_len * (c.seq_len + 1) // 2
    for backend in s.sdpa_backends:
        chosen = getattr(SDPBackend, SDPA_BACKENDS[backend])

        def fwd(chosen: SDPBackend = chosen) -> torch.Tensor:
            with sdpa_kernel([chosen]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwd_bwd(fwd: Callable[[], torch.Tensor] = fwd) -> tuple[torch.Tensor, ...]:
            return torch.autograd.grad(fwd(), [q, k, v], grad_out)

        for step, fn in (("fwd", fwd), ("fwd_bwd", fwd_bwd)):
            try:
                fn()
            except RuntimeError as error:  # this backend does not take the shape or dtype here
                out[step][backend] = {"error": str(error).splitlines()[0][:300]}
                continue
            ms = timer(fn)
            work = 2 * c.head_dim * c.heads * pairs * (2 if step == "fwd" else 6)
            out[step][backend] = {"ms": significant(ms), "flops": work, "TFLOPs": significant(work / (ms * 1e9)),
                                  "graphed_ms": significant(timer(graphed(fn)))}  # fmt: skip
    return out


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
            theirs = (
                f"{t['torch_ms']:>9.3f} {t['torch_TFLOPs']:>10.2f} {t['ratio_vs_torch']:>7.2f}"
                if "torch_ms" in t
                else f"{'-':>9} {'-':>10} {'-':>7}"
            )
            others = {f"sdpa {b}": a for b, a in t.get("sdpa", {}).items()} | (
                {"peer": t["peer"]} if "peer" in t else {}
            )
            anchors = "  ".join(
                f"{b} {a['ms']:.3f} ms ({a['TFLOPs']:.0f} TF/s)" if "ms" in a else f"{b}: {next(iter(a.values()))}"
                for b, a in others.items()
            )
            busy = f"  GPU busy {t['gpu']['busy_share']:.0%}" if "gpu" in t else ""
            print(
                f"{r['name']:<22} {step:<8} {t['ms']:>9.3f} {t['TFLOPs']:>8.2f} {t['GBps']:>7,.0f} {theirs}  "
                f"{anchors}{busy}"
            )
    for r in steps:
        print(f"training step {r['name']}: torch {r['torch_ms']:.3f} ms, triton {r['triton_ms']:.3f} ms, "
              f"x{r['ratio_vs_torch']:.2f}")  # fmt: skip


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/kernels-hstu-attention.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    device = kernel_device(settings.smoke, "benchmarks/configs/kernels-hstu-attention-smoke.yaml")
    name, head = result_head(device, settings.result_name, settings.smoke)
    check_peer(settings)

    timer, timer_note = make_timer(device, settings.cpu_repeats)
    cases = []
    for c in settings.cases:
        cases.append(run_case(c, settings, device, timer))
        print(f"  {c.name}: fwd+bwd {cases[-1]['fwd_bwd']['ms']:.3f} ms ({cases[-1]['fwd_bwd']['TFLOPs']} TFLOP/s)")
    steps = [run_step(c, settings, device, timer) for c in settings.steps]
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
            "sdpa": "causal scaled_dot_product_attention (softmax) of the case padded to S x H x L x E with one "
            "backend: its TFLOP/s count its own causal pairs; ours_time_over_sdpa = ours ms / its ms",
            "peer": "Meta generative-recommenders' triton_hstu_mha at peer_commit on the same jagged q, k, v (no "
            "position or time bias: its kernel has none), in a process of its own; ours_time_over_peer = ours ms / "
            "its ms",
            "graphed_ms": "the same step captured in a CUDA graph and replayed (`graphed`): its time without the "
            "host's work per call; ms - graphed_ms is about what the host adds",
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
    defaults = field_defaults(Settings)
    for key, value in jsonable(asdict(settings)).items():
        if key in ("cases", "steps"):  # entry by entry below
            continue
        if recorded.get(key, defaults.get(key, "<absent>")) != value:  # older results lack newer keys
            yield f"settings.{key}: the result has {recorded.get(key, '<absent>')!r}, the config {value!r}"
    if result.get("smoke") != settings.smoke:
        yield f"smoke: the result has {result.get('smoke')!r}, the config {settings.smoke!r}"
    yield from cpu_timer_mismatch(result.get("timer"), settings.cpu_repeats)
    sections: tuple[tuple[str, tuple[Any, ...]], ...] = (("cases", settings.cases), ("steps", settings.steps))
    for section, expected in sections:
        names = [entry.get("name") for entry in result.get(section, [])]
        if names != [c.name for c in expected]:
            yield f"{section}: the result has {names}, the config {[c.name for c in expected]}"
        for entry, c in zip(result.get(section, []), expected, strict=False):
            defaults = field_defaults(type(c))
            for key, value in asdict(c).items():
                if entry.get(key, defaults.get(key, "<absent>")) != value:  # a key older results lack, at its default
                    yield f"{section}[{c.name}].{key}: the result has {entry.get(key)!r}, the config {value!r}"


if __name__ == "__main__":
    main()
