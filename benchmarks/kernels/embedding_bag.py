"""Kernel benchmark: the Triton embedding bag against torch (and FBGEMM where it runs), in GB/s; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.kernels.embedding_bag   # on a CUDA GPU: the issue's cases (~5 GB tables)
    .venv/bin/python -m benchmarks.kernels.embedding_bag --config benchmarks/configs/kernels-embedding-bag-smoke.yaml
        # tiny sizes; on CPU in Triton's interpreter
    .venv/bin/python -m benchmarks.kernels.embedding_bag --set cases=[fwd-fp32,fwd-bf16]   # only these cases

Settings: benchmarks/configs/kernels-embedding-bag.yaml (`--config`, `--set KEY=VALUE`).

Cases (one run): forward fp32 / bf16, D=128, 10M rows, B=65,536 bags of 20 ids, uniform ids, and the fp32
forward with Zipf-skewed ids (alpha 1.15); the training side as a matrix of op (forward + backward to a sparse
gradient, + fused SGD, + fused exact row-wise Adagrad, + fused Adam) x table dtype (fp32, bf16) x ids
(uniform, Zipf), plus fused row-wise Adam, bf16 Adam with stochastic rounding, and the deterministic backward
(its cost); 32 tables x 100,000 rows, B=512, in one launch against 32 F.embedding_bag calls. The torch side of
the training cases is F.embedding_bag(sparse=True), backward, then torch.optim.SGD / Adagrad / SparseAdam on
the sparse gradient. Before timing, each case checks its Triton result on a slice of the batch.

Times are `triton.testing.do_bench` medians (L2 flushed between runs) on CUDA, perf_counter medians on
CPU. GB/s = the bytes the op must move (counted per op below, the same count for every implementation)
/ time; `copy_GBps` is a device-to-device copy measured in the same run (bytes read + written).
Writes benchmarks/results/<result_name>.json (default kernels-embedding-bag-{device}, `{device}` the GPU's short
name; `-smoke` appended for a `smoke: true` config), with the settings and how to reproduce it. A case that runs
out of GPU memory is recorded with the error and the device's memory at that moment (`failed` lists them) and the
run goes on; `memory_at_start` says how much of the GPU was held outside this process's torch before the first case
(another process, or JAX in this one: JAX_PLATFORMS=cpu).
"""

from __future__ import annotations

import logging
import re
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import (
    benchmark_parser,
    parse_run,
    provenance,
    result_name_for,
    settings_from,
    significant,
    write_result,
)
from benchmarks.reproduce import field_defaults, jsonable
from recsys.ops.embedding_bag import Kernel, OptimType, RowwiseOptimizer, embedding_bag, fused_backward_update
from recsys.ops.reference import embedding_bag as reference

logger = logging.getLogger(__name__)
LR = 0.01
EPS = 1e-8
HELD_ELSEWHERE_WARNING = 0.25  # share of the GPU held outside torch before the first case that earns a warning
# the fused optimizer of each training op (fwd_bwd: none, the sparse gradient itself)
FUSED = {
    "fwd_bwd_sgd": OptimType.SGD,
    "fwd_bwd_rowwise_adagrad": OptimType.EXACT_ROWWISE_ADAGRAD,
    "fwd_bwd_adam": OptimType.ADAM,
    "fwd_bwd_rowwise_adam": OptimType.ROWWISE_ADAM,
}
OPS = ("fwd", "fwd_bwd", *FUSED)
TOLERANCE: dict[torch.dtype, dict[str, Any]] = {
    torch.float32: {"rtol": 1e-4, "atol": 1e-4},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
}


@dataclass(frozen=True)
class Settings:
    """What the benchmark measures (benchmarks/configs/kernels-embedding-bag*.yaml)."""

    # a quick check, not a measurement: it may run on CPU (Triton's interpreter) and its result is named `-smoke`
    smoke: bool
    cases: tuple[str, ...]  # run only these cases (names of `all_cases`); empty: all
    rows: int  # rows of the single-table cases (fp32 D=128, 10M rows: 5.1 GB)
    dim: int  # D, every case
    batch: int  # bags per table of the single-table cases
    pool: int  # ids per bag, every case
    multi_tables: int  # tables of the many-tables case (one launch against one F.embedding_bag call per table)
    multi_rows: int  # rows per table of the many-tables case
    multi_batch: int  # bags per table of the many-tables case
    zipf_alpha: float  # skew of the `-zipf` case's ids: rank k drawn with probability ~ k^-alpha
    check_bags: int  # bags (per table) of the slice each case checks against torch before timing
    copy_bytes: int  # size of the buffer copied for copy_GBps
    cpu_repeats: int  # on CPU, timed runs per step (median, after one warm-up); on CUDA do_bench decides
    result_name: str = "kernels-embedding-bag-{device}"  # benchmarks/results/<this>.json, `{device}` the GPU's

    def __post_init__(self) -> None:
        known = [c.name for c in all_cases(self)]
        unknown = [name for name in self.cases if name not in known]
        if unknown:
            raise ValueError(f"cases: unknown {unknown} (known: {', '.join(known)})")


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


@dataclass(frozen=True)
class Case:
    name: str
    op: str  # one of OPS
    dtype: torch.dtype
    rows: int  # per table
    dim: int
    batch: int
    pool: int
    tables: int
    ids: str  # "uniform" | "zipf"
    deterministic: bool = False  # the backward's deterministic mode (`deterministic=True`)
    stochastic_rounding: bool = False  # bf16 fused updates rounded stochastically


def all_cases(s: Settings) -> list[Case]:
    base = Case("fwd-fp32", "fwd", torch.float32, s.rows, s.dim, s.batch, s.pool, 1, "uniform")
    bf16 = {"fp32": torch.float32, "bf16": torch.bfloat16}
    training = [
        replace(base, name=f"{op}-{dtype}" + ("-zipf" if ids == "zipf" else ""), op=op, dtype=bf16[dtype], ids=ids)
        for op in ("fwd_bwd", "fwd_bwd_sgd", "fwd_bwd_rowwise_adagrad", "fwd_bwd_adam")
        for dtype in bf16
        for ids in ("uniform", "zipf")
    ]
    return [
        base,
        replace(base, name="fwd-bf16", dtype=torch.bfloat16),
        replace(base, name="fwd-fp32-zipf", ids="zipf"),
        *training,
        replace(base, name="fwd_bwd_rowwise_adam-fp32", op="fwd_bwd_rowwise_adam"),
        replace(base, name="fwd_bwd_adam-bf16-stochastic", op="fwd_bwd_adam", dtype=torch.bfloat16,
                stochastic_rounding=True),
        replace(base, name="fwd_bwd-fp32-deterministic", op="fwd_bwd", deterministic=True),
        replace(base, name="fwd_bwd-fp32-zipf-deterministic", op="fwd_bwd", ids="zipf", deterministic=True),
        replace(base, name=f"fwd-fp32-{s.multi_tables}tables", rows=s.multi_rows, batch=s.multi_batch,
                tables=s.multi_tables),
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------- bytes per op
# Bytes the op has to move through memory, the same count for every implementation: duplicate ids each
# read their row (a lookup), while the backward reads each bag's output gradient once and touches each of
# the U unique rows once. Sorting, index bookkeeping and re-reads served from cache are not counted.


def _elem(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def fwd_bytes(c: Case) -> int:
    ids = c.tables * c.batch * c.pool
    return (
        ids * c.dim * _elem(c.dtype)  # one table row read per id
        + ids * 8  # the ids (int64)
        + (c.tables * c.batch + 1) * 8  # the bag offsets (int64)
        + c.batch * c.tables * c.dim * _elem(c.dtype)  # the pooled output written, in the table dtype
    )


def _bwd_input_bytes(c: Case) -> int:
    ids = c.tables * c.batch * c.pool
    return (
        c.batch * c.tables * c.dim * _elem(c.dtype)  # the output gradient, each bag's row read once
        + ids * 8  # the ids, read again to find each id's row
        + (c.tables * c.batch + 1) * 8  # the bag offsets, read again
    )


def fwd_bwd_bytes(c: Case, unique_rows: int) -> int:
    return (
        fwd_bytes(c)
        + _bwd_input_bytes(c)
        + unique_rows * c.dim * _elem(c.dtype)  # the sparse gradient's U rows written, in the table dtype
        + unique_rows * 8  # and their row numbers (int64)
    )


def fused_update_bytes(c: Case, unique_rows: int) -> int:
    """Forward, the backward's inputs, and each touched row read and written once with its fp32 state."""
    state_per_row = {
        OptimType.SGD: 0,
        OptimType.EXACT_ROWWISE_ADAGRAD: 4,  # one fp32 sum
        OptimType.ADAM: 2 * c.dim * 4,  # two fp32 moments per element
        OptimType.ROWWISE_ADAM: c.dim * 4 + 4,  # fp32 first moments per element, one second moment
    }[FUSED[c.op]]
    return fwd_bytes(c) + _bwd_input_bytes(c) + 2 * unique_rows * (c.dim * _elem(c.dtype) + state_per_row)


def case_bytes(c: Case, unique_rows: int) -> int:
    if c.op == "fwd":
        return fwd_bytes(c)
    if c.op == "fwd_bwd":
        return fwd_bwd_bytes(c, unique_rows)
    return fused_update_bytes(c, unique_rows)


# -------------------------------------------------------------------------------------------------- inputs


@dataclass
class Problem:
    """One batch in the layout of `recsys.ops.embedding_bag` (T tables, B bags per table, fixed pool P)."""

    weights: torch.Tensor  # (T*R, D)
    indices: torch.Tensor  # (T*B*P,) int64 ids local to their table, table-major
    offsets: torch.Tensor  # (T*B+1,) int64
    row_offsets: torch.Tensor  # (T+1,) int64
    tables: int
    pool: int

    @property
    def batch(self) -> int:
        return (self.offsets.numel() - 1) // self.tables

    def flat_rows(self) -> torch.Tensor:
        """(N,) row of each id in the flat buffer."""
        table = torch.arange(self.tables, device=self.indices.device).repeat_interleave(self.batch * self.pool)
        return self.row_offsets[table] + self.indices

    def sliced(self, bags: int) -> Problem:
        """The first `bags` bags of every table (the correctness slice)."""
        bags = min(bags, self.batch)
        ids = self.indices.view(self.tables, self.batch, self.pool)[:, :bags].reshape(-1)
        return replace(self, indices=ids, offsets=_fixed_offsets(self.tables * bags, self.pool, ids.device))

    def compacted(self) -> Problem:
        """The same bags over one small table holding only the touched rows (for checking updates; T=1)."""
        assert self.tables == 1, "compacted() keeps the (B, D) layout of one table only"
        unique, inverse = torch.unique(self.flat_rows(), return_inverse=True)
        return Problem(
            self.weights[unique].clone(), inverse.flatten(), self.offsets[: self.tables * self.batch + 1].clone(),
            torch.tensor([0, unique.numel()], device=unique.device), 1, self.pool,
        )  # fmt: skip


def _fixed_offsets(bags: int, pool: int, device: torch.device) -> torch.Tensor:
    return torch.arange(bags + 1, dtype=torch.int64, device=device) * pool


def zipf_ids(num_rows: int, n: int, alpha: float, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """(n,) ids in [0, num_rows): rank k has probability ~ k^-alpha (inverse CDF), ranks shuffled over the rows."""
    weights = torch.arange(1, num_rows + 1, dtype=torch.float64, device=device).pow_(-alpha)
    cdf = torch.cumsum(weights, dim=0)
    u = torch.rand(n, dtype=torch.float64, device=device, generator=gen) * cdf[-1]
    rank = torch.searchsorted(cdf, u).clamp_(max=num_rows - 1)
    return torch.randperm(num_rows, device=device, generator=gen)[rank]


def make_problem(c: Case, zipf_alpha: float, device: torch.device, seed: int = 0) -> Problem:
    gen = torch.Generator(device=device).manual_seed(seed)
    n = c.batch * c.pool
    per_table = [
        zipf_ids(c.rows, n, zipf_alpha, gen, device)
        if c.ids == "zipf"
        else torch.randint(0, c.rows, (n,), device=device, generator=gen)
        for _ in range(c.tables)
    ]
    weights = torch.randn(c.tables * c.rows, c.dim, device=device, dtype=c.dtype, generator=gen)
    return Problem(
        weights, torch.cat(per_table), _fixed_offsets(c.tables * c.batch, c.pool, device),
        torch.arange(c.tables + 1, device=device) * c.rows, c.tables, c.pool,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------- implementations
# Each returns a step function; forward steps return the (B, T*D) output, update steps update in place.


def ours_step(c: Case, p: Problem, grad_output: torch.Tensor) -> Callable[[], Any]:
    if c.op == "fwd":
        return lambda: embedding_bag(p.weights, p.indices, p.offsets, p.row_offsets, kernel=Kernel.TRITON)
    if c.op == "fwd_bwd":
        leaf = p.weights.detach().requires_grad_()

        def fwd_bwd() -> torch.Tensor:
            leaf.grad = None
            embedding_bag(
                leaf, p.indices, p.offsets, p.row_offsets, kernel=Kernel.TRITON, deterministic=c.deterministic
            ).backward(grad_output)
            assert leaf.grad is not None
            return leaf.grad  # sparse (R, D)

        return fwd_bwd
    optimizer = RowwiseOptimizer(FUSED[c.op], lr=LR, eps=EPS, stochastic_rounding=c.stochastic_rounding)
    state = optimizer.init_state(p.weights)

    def fwd_bwd_update() -> torch.Tensor:
        embedding_bag(p.weights, p.indices, p.offsets, p.row_offsets, kernel=Kernel.TRITON)
        fused_backward_update(grad_output, p.weights, p.indices, p.offsets, p.row_offsets, optimizer=optimizer,
                              state=state, kernel=Kernel.TRITON, deterministic=c.deterministic)  # fmt: skip
        return p.weights

    return fwd_bwd_update


def torch_step(op: str, p: Problem, grad_output: torch.Tensor) -> tuple[Callable[[], Any], str]:
    """(step, what it does) with torch's own ops."""
    if op == "fwd" and p.tables > 1:
        rows = p.weights.shape[0] // p.tables
        tables = [p.weights[t * rows : (t + 1) * rows] for t in range(p.tables)]
        ids = p.indices.view(p.tables, -1)
        local_offsets = _fixed_offsets(p.batch, p.pool, p.weights.device)

        def per_table() -> torch.Tensor:
            outs = [
                F.embedding_bag(ids[t], tables[t], local_offsets, mode="sum", include_last_offset=True)
                for t in range(p.tables)
            ]
            return torch.cat(outs, dim=1)

        return per_table, f"{p.tables} F.embedding_bag calls (one per table) + torch.cat to (B, T*D)"
    if op == "fwd":

        def one_call() -> torch.Tensor:
            return F.embedding_bag(p.indices, p.weights, p.offsets, mode="sum", include_last_offset=True)

        return one_call, "F.embedding_bag(mode='sum')"
    param = torch.nn.Parameter(p.weights.detach())  # shares the storage
    optim: torch.optim.Optimizer | None = None
    what = "F.embedding_bag(sparse=True) + backward"
    if op == "fwd_bwd_sgd":
        optim, what = torch.optim.SGD([param], lr=LR), what + " + torch.optim.SGD step (sparse gradient)"
    elif op == "fwd_bwd_rowwise_adagrad":
        optim = torch.optim.Adagrad([param], lr=LR, eps=EPS)
        what += " + torch.optim.Adagrad step (sparse gradient; element-wise state, not row-wise)"
    elif op in ("fwd_bwd_adam", "fwd_bwd_rowwise_adam"):
        optim = torch.optim.SparseAdam([param], lr=LR, eps=EPS)
        what += " + torch.optim.SparseAdam step (element-wise moments in the table dtype)"

    def fwd_bwd() -> torch.Tensor:
        param.grad = None
        out = F.embedding_bag(p.indices, param, p.offsets, mode="sum", include_last_offset=True, sparse=True)
        out.backward(grad_output)
        if optim is not None:
            optim.step()
            return param.detach()
        assert param.grad is not None
        return param.grad

    return fwd_bwd, what


def fbgemm_step(c: Case, p: Problem, grad_output: torch.Tensor) -> Callable[[], Any] | None:
    """FBGEMM's TBE (fused backward + optimizer), or None for ops it has no counterpart of."""
    if c.op not in ("fwd", "fwd_bwd_sgd", "fwd_bwd_rowwise_adagrad"):
        return None  # fwd_bwd: its TBE fuses the optimizer (no plain sparse gradient); Adam: not compared yet
    from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    cuda = p.weights.device.type == "cuda"
    where = (EmbeddingLocation.DEVICE, ComputeDevice.CUDA) if cuda else (EmbeddingLocation.HOST, ComputeDevice.CPU)
    precision = SparseType.BF16 if c.dtype == torch.bfloat16 else SparseType.FP32
    optim = EmbOptimType.EXACT_ROWWISE_ADAGRAD if c.op == "fwd_bwd_rowwise_adagrad" else EmbOptimType.EXACT_SGD
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(c.rows, c.dim, *where) for _ in range(c.tables)],
        optimizer=optim, learning_rate=LR, eps=EPS, pooling_mode=PoolingMode.SUM,
        weights_precision=precision, output_dtype=precision, device=p.weights.device,
    )  # fmt: skip
    if c.op == "fwd":
        return lambda: tbe(p.indices, p.offsets)
    return lambda: tbe(p.indices, p.offsets).backward(grad_output)  # the update happens in the backward


def fbgemm_status(device: torch.device) -> str | None:
    """None when FBGEMM's TBE runs on `device`, else why not (e.g. the CPU build on a GPU)."""
    try:
        c = Case("probe", "fwd", torch.float32, rows=8, dim=8, batch=2, pool=2, tables=1, ids="uniform")
        p = make_problem(c, zipf_alpha=1.0, device=device)
        step = fbgemm_step(c, p, torch.zeros(2, 8, device=device))
        assert step is not None
        step()
    except Exception as err:  # an optional comparison: any failure only means "not here"
        return _describe(err)
    return None


def _describe(err: Exception) -> str:
    first_line = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {first_line}"[:300]


# ------------------------------------------------------------------------------------------------ checking


def check(c: Case, p: Problem) -> str:
    """Assert the Triton result equals torch's (or the fp32 reference's, for the optimizers torch has no exact
    counterpart of) on this small slice."""
    gen = torch.Generator(device=p.weights.device).manual_seed(1)
    grad_output = torch.randn(p.batch, p.tables * c.dim, device=p.weights.device, generator=gen).to(c.dtype)
    tolerance = TOLERANCE[c.dtype]
    if c.op == "fwd":
        ours, theirs = ours_step(c, p, grad_output)(), torch_step(c.op, p, grad_output)[0]()
        torch.testing.assert_close(ours.float(), theirs.float(), **tolerance)
        return f"forward of {p.batch} bags per table = torch's"
    # Training: against the fp32 reference (torch sums a bf16 table's duplicate ids in bf16, far from it on hot rows,
    # and its optimizers keep other state), on a copy of the touched rows (updates change the table).
    small = p.compacted()
    expected = reference_training_step(c, small, grad_output)
    against = "the fp32 reference"
    ours = ours_step(c, small, grad_output)()
    if ours.is_sparse:
        ours, expected = ours.to_dense(), expected.to_dense()
    if c.stochastic_rounding:  # each value one of the two bf16 neighbours of the fp32 result: within 1 ulp
        tolerance = {"rtol": 2 * 2.0**-8, "atol": 1e-3}
    torch.testing.assert_close(ours.float(), expected.float(), **tolerance)
    return f"{c.op} on {p.batch} bags ({small.weights.shape[0]} unique rows) = {against}"


def reference_training_step(c: Case, small: Problem, grad_output: torch.Tensor) -> torch.Tensor:
    """The fp32 reference's result of the case's op on `small` (all of its rows are touched): the dense table
    gradient for fwd_bwd, else the table after one step of the fused optimizer."""
    weights = small.weights.float().requires_grad_()
    reference.embedding_bag(weights, small.indices, small.offsets).backward(grad_output.float())
    grad = weights.grad
    assert grad is not None
    if c.op == "fwd_bwd":
        return grad
    rows, dim = small.weights.shape
    device = small.weights.device
    optim = FUSED[c.op]
    if optim is OptimType.SGD:
        return reference.sgd_update(small.weights, grad, LR)
    if optim is OptimType.EXACT_ROWWISE_ADAGRAD:
        return reference.rowwise_adagrad_update(small.weights, torch.zeros(rows, device=device), grad, LR, EPS)[0]
    second = torch.zeros(rows, dim, device=device) if optim is OptimType.ADAM else torch.zeros(rows, device=device)
    return reference.adam_update(
        small.weights, torch.zeros(rows, dim, device=device), second, grad,
        torch.ones(rows, dtype=torch.bool, device=device), step=1, lr=LR, beta1=0.9, beta2=0.999, eps=EPS,
    )[0]  # fmt: skip


# -------------------------------------------------------------------------------------------------- timing


def kernel_device(smoke: bool, smoke_config: str) -> torch.device:
    """The GPU; the CPU (Triton's interpreter) only for a smoke run, since CPU timings say nothing of a kernel."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if not smoke:
        raise SystemExit(
            "no CUDA device: this benchmark is for a GPU. Fix: for a quick run on CPU (Triton's interpreter), "
            f"--config {smoke_config}"
        )
    return torch.device("cpu")


def make_timer(device: torch.device, cpu_repeats: int) -> tuple[Callable[[Callable[[], Any]], float], str]:
    """(a function returning the median milliseconds of a step, its description); on CPU, the median of
    `cpu_repeats` runs after one warm-up."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return (
            lambda fn: float(do_bench(fn, return_mode="median")),
            "triton.testing.do_bench median (warmup 25 ms, rep 100 ms, L2 flushed between runs)",
        )
    reps = cpu_repeats

    def cpu_median(fn: Callable[[], Any]) -> float:
        fn()  # warm-up (compilation, allocation)
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    return cpu_median, f"time.perf_counter median of {reps} runs after one warm-up (CPU)"


def copy_bandwidth(num_bytes: int, device: torch.device, timer: Callable[[Callable[[], Any]], float]) -> float:
    """GB/s of a device-to-device copy of `num_bytes` (bytes read + written)."""
    src = torch.randn(num_bytes // 4, device=device)
    dst = torch.empty_like(src)
    ms = timer(lambda: dst.copy_(src))
    return 2 * src.numel() * 4 / (ms * 1e6)


def tuned_problem(c: Case, settings: Settings, device: torch.device) -> tuple[Problem, torch.Tensor]:
    """Case `c`'s inputs and output gradient at full size, its forward kernel autotuned on them (the autotune key has
    no batch size: tuned on a smaller batch, the config would not be this size's)."""
    p = make_problem(c, settings.zipf_alpha, device)
    ours_step(replace(c, op="fwd"), p, torch.empty(0))()
    return p, torch.randn(c.batch, c.tables * c.dim, device=device).to(c.dtype)


def run_case(
    c: Case,
    settings: Settings,
    device: torch.device,
    timer: Callable[[Callable[[], Any]], float],
    copy_gbps: float,
    fbgemm_reason: str | None,
) -> dict[str, Any]:
    p, grad_output = tuned_problem(c, settings, device)
    checked = check(c, p.sliced(settings.check_bags))
    unique_rows = int(torch.unique(p.flat_rows()).numel())
    nbytes = case_bytes(c, unique_rows)
    ours = ours_step(c, p, grad_output)
    ours()  # the backward's chunk size is tuned per size class of the batch: tune it at this size, untimed
    ms = timer(ours)
    torch_fn, torch_impl = torch_step(c.op, p, grad_output)
    torch_ms = timer(torch_fn)
    fbgemm_ms: float | None = None
    fbgemm_note = fbgemm_reason
    fbgemm_fn: Callable[[], Any] | None = None
    if fbgemm_reason is None:
        try:
            fbgemm_fn = fbgemm_step(c, p, grad_output)
            if fbgemm_fn is None:
                fbgemm_note = "no FBGEMM counterpart: its TBE fuses the optimizer into the backward"
            else:
                fbgemm_ms = timer(fbgemm_fn)
        except Exception as err:  # optional: a failing FBGEMM case must not lose the others' figures
            fbgemm_note = _describe(err)
    gbps = nbytes / (ms * 1e6)
    result = {
        **case_fields(c),
        "unique_rows": unique_rows,
        "bytes": nbytes,
        "ms": significant(ms),
        "GBps": significant(gbps),
        "torch_ms": significant(torch_ms),
        "torch_GBps": significant(nbytes / (torch_ms * 1e6)),
        "ratio_vs_torch": significant(torch_ms / ms),
        "fraction_of_copy": significant(gbps / copy_gbps),
        "torch_impl": torch_impl,
        "fbgemm_ms": None if fbgemm_ms is None else significant(fbgemm_ms),
        "fbgemm_GBps": None if fbgemm_ms is None else significant(nbytes / (fbgemm_ms * 1e6)),
        "fbgemm_note": fbgemm_note,
        "checked": checked,
    }
    del p, grad_output, ours, torch_fn, fbgemm_fn  # and the optimizer states they hold, before the cache is emptied
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def case_fields(c: Case) -> dict[str, Any]:
    """The case's name and shape as a result records them."""
    return {**asdict(c), "dtype": str(c.dtype).removeprefix("torch.")}


def device_memory(device: torch.device) -> dict[str, int] | None:
    """Bytes of the GPU: total, free, reserved by this process's torch, and held outside it (other processes, another
    framework in this one, the CUDA context); None on CPU."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    reserved = torch.cuda.memory_reserved(device)
    return {"total": total, "free": free, "torch_reserved": reserved, "held_elsewhere": total - free - reserved}


def out_of_memory_case(c: Case, err: torch.OutOfMemoryError, device: torch.device) -> dict[str, Any]:
    """The record of a case that ran out of memory: its shape, the error and the device's memory when it happened."""
    memory = device_memory(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    logger.error("case %s ran out of memory (%s); the run goes on with the next case", c.name, _describe(err))
    return {**case_fields(c), "error": _describe(err), "memory": memory}


def warn_if_held_elsewhere(memory: dict[str, int] | None) -> None:
    if memory is not None and memory["held_elsewhere"] > HELD_ELSEWHERE_WARNING * memory["total"]:
        logger.warning(
            "%.1f of %.1f GiB of the GPU is held outside this process's torch before the first case: the large cases "
            "may run out of memory. Fix: stop the other process, or keep other frameworks off the GPU (JAX: "
            "JAX_PLATFORMS=cpu)", memory["held_elsewhere"] / 2**30, memory["total"] / 2**30,
        )  # fmt: skip


# ------------------------------------------------------------------------------------------------ the CLI


def gpu_name(device: torch.device) -> tuple[str, str]:
    """(the device's name, a short slug for the file name: "h100", "cpu")."""
    if device.type != "cuda":
        return "cpu", "cpu"
    name = torch.cuda.get_device_name(device)
    model = re.search(r"\b([A-Z]+\d{2,4}[A-Za-z]?)\b", name)
    slug = model.group(1) if model else name
    return name, re.sub(r"[^a-z0-9]+", "-", slug.lower()).strip("-")


def result_head(device: torch.device, result_name: str, smoke: bool) -> tuple[str, dict[str, Any]]:
    """A kernel result's name (its `result_name` setting for this GPU, `-smoke` for a smoke run) and the fields it
    starts with. Taken before the run: a result name it cannot write fails at once."""
    import triton

    gpu, slug = gpu_name(device)
    name = result_name_for(result_name, slug) + ("-smoke" if smoke else "")
    return name, {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__, "smoke": smoke}


def print_table(cases: list[dict[str, Any]], copy_gbps: float) -> None:
    print(f"device-to-device copy: {copy_gbps:,.0f} GB/s")
    header = (
        f"{'case':<32} {'ms':>9} {'GB/s':>8} {'copy':>5} {'torch ms':>9} {'torch GB/s':>10} {'x torch':>7} "
        f"{'fbgemm ms':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in cases:
        if "error" in r:
            print(f"{r['name']:<32} {r['error']}")
            continue
        fbgemm = "-" if r["fbgemm_ms"] is None else f"{r['fbgemm_ms']:.3f}"
        print(
            f"{r['name']:<32} {r['ms']:>9.3f} {r['GBps']:>8,.0f} {r['fraction_of_copy']:>5.0%} {r['torch_ms']:>9.3f} "
            f"{r['torch_GBps']:>10,.0f} {r['ratio_vs_torch']:>7.2f} {fbgemm:>9}"
        )


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/kernels-embedding-bag.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)

    device = kernel_device(settings.smoke, "benchmarks/configs/kernels-embedding-bag-smoke.yaml")
    name, head = result_head(device, settings.result_name, settings.smoke)

    cases = [c for c in all_cases(settings) if not settings.cases or c.name in settings.cases]
    timer, timer_note = make_timer(device, settings.cpu_repeats)
    copy_gbps = copy_bandwidth(settings.copy_bytes, device, timer)
    fbgemm_reason = fbgemm_status(device)
    memory_at_start = device_memory(device)
    warn_if_held_elsewhere(memory_at_start)
    results = []
    for c in cases:
        try:
            results.append(run_case(c, settings, device, timer, copy_gbps, fbgemm_reason))
        except torch.OutOfMemoryError as err:  # the other cases' figures are kept
            results.append(out_of_memory_case(c, err, device))
            print(f"  {c.name}: out of memory", flush=True)
            continue
        print(f"  {c.name}: {results[-1]['ms']:.3f} ms, {results[-1]['GBps']:,.0f} GB/s", flush=True)
    result = {
        **head,
        "copy_GBps": significant(copy_gbps),
        "copy_bytes": _copied_bytes(settings),
        "timer": timer_note,
        "fbgemm": {"available": fbgemm_reason is None, "reason": fbgemm_reason},
        "memory_at_start": memory_at_start,
        "failed": [r["name"] for r in results if "error" in r],
        "notes": {
            "GBps": "bytes the op must move (see benchmarks/kernels/embedding_bag.py, *_bytes) / median time; "
            "1 GB = 1e9 bytes; the same byte count for ours, torch and FBGEMM",
            "ratio_vs_torch": "torch_ms / ms: above 1 means the Triton kernel is faster",
            "fraction_of_copy": "GBps / copy_GBps",
            "rows": "rows per table",
            "kernel": "ours = recsys.ops.embedding_bag with Kernel.TRITON (fused_backward_update for "
            "fwd_bwd_<optimizer>)",
        },
        "settings": asdict(settings),
        "cases": results,
        **provenance("triton", "fbgemm-gpu", "fbgemm-gpu-cpu"),
    }
    path = write_result(name, result, args.results_dir, reproduce)
    print_table(results, copy_gbps)
    print(f"-> {path}")
    return path


def recorded_mismatches(result: dict[str, Any], settings: Settings) -> Iterator[str]:
    """What the result records of its settings (`settings` where it has them, its smoke flag, copy size, and every
    case's shape) that differs from `settings`."""
    recorded = result.get("settings")
    if recorded is not None:
        defaults = field_defaults(Settings)
        for key, value in jsonable(asdict(settings)).items():
            if recorded.get(key, defaults.get(key, "<absent>")) != value:  # older results lack newer keys
                yield f"settings.{key}: the result has {recorded.get(key, '<absent>')!r}, the config {value!r}"
    if result.get("smoke") != settings.smoke:
        yield f"smoke: the result has {result.get('smoke')!r}, the config {settings.smoke!r}"
    yield from cpu_timer_mismatch(result.get("timer"), settings.cpu_repeats)
    if result.get("copy_bytes") != _copied_bytes(settings):
        yield f"copy_bytes: the result has {result.get('copy_bytes')!r}, the config {_copied_bytes(settings)!r}"
    expected = {c.name: c for c in all_cases(settings) if not settings.cases or c.name in settings.cases}
    names = [case.get("name") for case in result.get("cases", [])]
    if names != list(expected):
        yield f"cases: the result has {names}, the config {list(expected)}"
    for case in result.get("cases", []):
        c = expected.get(case.get("name"))
        if c is None:
            continue
        for key, value in case_fields(c).items():
            if key != "name" and case.get(key) != value:
                yield f"cases[{c.name}].{key}: the result has {case.get(key)!r}, the config {value!r}"


def cpu_timer_mismatch(timer: str | None, cpu_repeats: int) -> Iterator[str]:
    """A recorded CPU timer (`make_timer`'s note) that did not time `cpu_repeats` runs (a CUDA timer: nothing)."""
    expected = make_timer(torch.device("cpu"), cpu_repeats)[1]
    if timer is not None and timer.startswith("time.perf_counter") and timer != expected:
        yield f"timer: the result has {timer!r}, the config {expected!r}"


def _copied_bytes(settings: Settings) -> int:
    """Bytes one copy moves (read + written) for `copy_bytes` (whole fp32 elements)."""
    return 2 * (settings.copy_bytes // 4) * 4


if __name__ == "__main__":
    main()
