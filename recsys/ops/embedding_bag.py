"""Embedding bags of many tables in one call (TBE style): forward, row-sparse backward, fused optimizer.

Dimension letters: T tables, B bags per table (the batch), D embedding dim (shared by the tables of
one call), N ids, R rows of the flat weights buffer, U unique rows touched by a batch.

Layout (torchrec's `KeyedJaggedTensor` in, `KeyedTensor` out; drawn for T=2, B=2)::

    weights      (R, D)    all tables row-concatenated: table t = weights[row_offsets[t]:row_offsets[t+1]]
    row_offsets  (T+1,)    int64, [0, R0, R0+R1, ...]
    indices      (N,)      int64 ids local to their table, table-major then bag-major:
                           [t0 b0 | t0 b1 | t1 b0 | t1 b1]     (= KJT values)
    offsets      (T*B+1,)  int64, bag t*B+b = indices[offsets[t*B+b]:offsets[t*B+b+1]]   (= KJT offsets)
    output       (B, T*D)  output[b, t*D:(t+1)*D] = pooled bag t*B+b   (= KeyedTensor values)

Backends (`Kernel`): TORCH (plain PyTorch, any device), TRITON (CUDA, or CPU under TRITON_INTERPRET=1),
FBGEMM (the forward only, with FBGEMM's dense-gradient autograd, where fbgemm_gpu has a kernel for the
device; limits in `recsys.ops.fbgemm.embedding_bag`). `kernel=None` picks TRITON on CUDA when Triton is
installed, else TORCH (never FBGEMM); the choice is logged once per (kernel, device). An explicit request that
cannot run raises `KernelUnavailableError` saying what to do; nothing is swapped silently.

Gradients (TORCH and TRITON): the table gradient is row-sparse, a coalesced `torch.sparse_coo_tensor`
of shape (R, D) holding the U touched rows (like `nn.Embedding(sparse=True)`), or dense with
`sparse_grad=False`; duplicates of a row are summed in fp32 first. The TRITON backward is deterministic
(a segment sum over ids sorted by row); TORCH uses `index_add_` (atomics on CUDA) unless `deterministic=True`.

Values (offsets monotone, ids inside their table) are checked on CPU only: on CUDA a check would
synchronise the device.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from recsys.ops import dispatch
from recsys.ops.dispatch import Kernel as Kernel
from recsys.ops.dispatch import KernelUnavailableError as KernelUnavailableError  # re-exported for callers
from recsys.ops.reference import embedding_bag as reference
from recsys.ops.reference.embedding_bag import Pooling, bag_and_row_of_ids, id_scales

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class OptimType(enum.Enum):
    SGD = "sgd"
    EXACT_ROWWISE_ADAGRAD = "exact_rowwise_adagrad"  # FBGEMM's name and semantics
    ADAM = "adam"  # lazy: only touched rows move (SparseAdam's and FBGEMM's ADAM)
    ROWWISE_ADAM = "rowwise_adam"  # FBGEMM's PARTIAL_ROWWISE_ADAM: first moment per element, second per row


@dataclass(frozen=True)
class RowwiseOptimizer:
    """A fused optimizer applied to the touched rows, after the gradients of duplicate ids are summed."""

    optim: OptimType = OptimType.SGD
    lr: float = 0.01
    eps: float = 1e-8  # Adagrad and Adam; FBGEMM's default
    beta1: float = 0.9  # Adam only
    beta2: float = 0.999  # Adam only
    # bf16 tables: round each updated row to bf16 stochastically (unbiased) instead of to nearest, so updates
    # smaller than half a bf16 ulp are not lost every time (FBGEMM's default for low-precision tables)
    stochastic_rounding: bool = False

    def init_state(self, weights: torch.Tensor, seed: int = 0) -> OptimizerState:
        """Zero fp32 state for `weights` (R, D): what this optimizer keeps per row, on the table's device."""
        rows, dim = weights.shape
        device = weights.device
        per_element = self.optim in (OptimType.ADAM, OptimType.ROWWISE_ADAM)
        momentum1 = torch.zeros(rows, dim, device=device) if per_element else None
        momentum2 = {
            OptimType.SGD: None,
            OptimType.EXACT_ROWWISE_ADAGRAD: torch.zeros(rows, device=device),
            OptimType.ADAM: torch.zeros(rows, dim, device=device),
            OptimType.ROWWISE_ADAM: torch.zeros(rows, device=device),
        }[self.optim]
        return OptimizerState(momentum1, momentum2, step=0, seed=seed)


@dataclass
class OptimizerState:
    """The fp32 state of a fused optimizer over a table's R rows, updated in place by each step.

    SGD keeps none; row-wise Adagrad its (R,) running sums in `momentum2`; Adam (R, D) first and second moments;
    row-wise Adam (R, D) first moments and (R,) second. `step` counts the updates made (Adam's bias correction);
    `seed` and `step` seed stochastic rounding, so a run is reproducible.
    """

    momentum1: torch.Tensor | None = None
    momentum2: torch.Tensor | None = None
    step: int = 0
    seed: int = 0


def select_kernel(kernel: Kernel | None, device: torch.device) -> Kernel:
    """The kernel that will run on `device`: `kernel` itself (raising if it cannot), or the best available."""
    return dispatch.select_kernel(
        "embedding_bag", kernel, device, logger_name=__name__, triton_module="embedding_bag",
        fbgemm_module="embedding_bag",
    )  # fmt: skip


def _select_unfused_kernel(kernel: Kernel | None, device: torch.device, op: str) -> Kernel:
    """`select_kernel` for the ops without an FBGEMM backend (its fused optimizers live in its own TBE module)."""
    return dispatch.select_kernel(
        op, kernel, device, logger_name=__name__, triton_module="embedding_bag",
        fbgemm_missing=f"Kernel.FBGEMM has no {op}: FBGEMM's fused optimizers belong to its TBE module "
        "(fbgemm_gpu's SplitTableBatchedEmbeddingBagsCodegen, which owns the weights)",
    )  # fmt: skip


def _triton_backend(device: torch.device) -> ModuleType:
    return dispatch.triton_backend("embedding_bag", device)


def _resolve_row_offsets(weights: torch.Tensor, row_offsets: torch.Tensor | None) -> torch.Tensor:
    if row_offsets is None:
        return torch.tensor([0, weights.shape[0]], dtype=torch.int64, device=weights.device)
    return row_offsets


def _validate(
    weights: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    row_offsets: torch.Tensor,
    pooling: str,
    per_sample_weights: torch.Tensor | None,
) -> tuple[int, int]:
    """Check shapes, dtypes and devices (and values on CPU); returns (T, B)."""
    if weights.ndim != 2 or weights.dtype not in _FLOAT_DTYPES or (weights.shape[1] > 1 and weights.stride(1) != 1):
        raise ValueError(
            f"weights must be a (R, D) fp32/bf16/fp16 tensor with unit stride in D, got shape "
            f"{tuple(weights.shape)} {weights.dtype} strides {weights.stride()}"
        )
    for name, tensor in (("indices", indices), ("offsets", offsets), ("row_offsets", row_offsets)):
        if tensor.ndim != 1 or tensor.dtype != torch.int64:
            raise ValueError(f"{name} must be a 1-d int64 tensor, got shape {tuple(tensor.shape)} {tensor.dtype}")
        if tensor.device != weights.device:
            raise ValueError(f"{name} is on {tensor.device} but weights are on {weights.device}")
    if pooling not in ("sum", "mean"):
        raise ValueError(f'pooling must be "sum" or "mean", got {pooling!r}')
    num_tables = row_offsets.numel() - 1
    if num_tables < 1 or offsets.numel() < 1 or (offsets.numel() - 1) % num_tables:
        raise ValueError(
            f"offsets must hold T*B+1 values for T={num_tables} tables (row_offsets has T+1), got {offsets.numel()}"
        )
    if per_sample_weights is not None and (
        per_sample_weights.shape != indices.shape
        or per_sample_weights.dtype not in _FLOAT_DTYPES
        or per_sample_weights.device != weights.device
    ):
        raise ValueError(
            f"per_sample_weights must be a float tensor shaped like indices {tuple(indices.shape)} on "
            f"{weights.device}, got {tuple(per_sample_weights.shape)} {per_sample_weights.dtype} "
            f"on {per_sample_weights.device}"
        )
    if weights.device.type == "cpu":
        _check_values(weights, indices, offsets, row_offsets)
    return num_tables, (offsets.numel() - 1) // num_tables


def _check_values(
    weights: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, row_offsets: torch.Tensor
) -> None:
    if int(offsets[0]) != 0 or int(offsets[-1]) != indices.numel() or bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(f"offsets must rise from 0 to len(indices)={indices.numel()}, got {offsets.tolist()[:8]}...")
    if int(row_offsets[0]) != 0 or int(row_offsets[-1]) > weights.shape[0] or bool((row_offsets.diff() < 0).any()):
        raise ValueError(f"row_offsets must rise from 0 to at most R={weights.shape[0]}, got {row_offsets.tolist()}")
    bag, rows = bag_and_row_of_ids(indices, offsets, row_offsets)
    table = bag // max((offsets.numel() - 1) // (row_offsets.numel() - 1), 1)
    bad = (indices < 0) | (rows >= row_offsets[table + 1])
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"indices[{i}]={int(indices[i])} is outside table {int(table[i])} "
            f"(rows {int(row_offsets[table[i]])}..{int(row_offsets[table[i] + 1]) - 1} of weights)"
        )


def _torch_forward(
    weights: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    row_offsets: torch.Tensor,
    pooling: Pooling,
    per_sample_weights: torch.Tensor | None,
    output_dtype: torch.dtype,
) -> torch.Tensor:
    if per_sample_weights is not None or output_dtype != weights.dtype:
        # F.embedding_bag wants weights of the table dtype and returns that dtype: gather in fp32 instead.
        return reference.embedding_bag(
            weights, indices, offsets, row_offsets,
            pooling=pooling, per_sample_weights=per_sample_weights, output_dtype=output_dtype,
        )  # fmt: skip
    num_tables = row_offsets.numel() - 1
    batch_size = (offsets.numel() - 1) // num_tables
    dim = weights.shape[1]
    _, rows = bag_and_row_of_ids(indices, offsets, row_offsets)
    # One call over all T*B bags of the flat buffer (sums in fp32 for bf16/fp16 tables).
    pooled = F.embedding_bag(rows, weights, offsets, mode=pooling, include_last_offset=True)  # (T*B, D)
    return pooled.view(num_tables, batch_size, dim).transpose(0, 1).reshape(batch_size, num_tables * dim)


def _bag_gradients(grad_output: torch.Tensor, num_tables: int) -> torch.Tensor:
    """(B, T*D) -> (T*B, D), bag t*B+b in row t*B+b."""
    batch_size = grad_output.shape[0]
    dim = grad_output.shape[1] // num_tables
    return grad_output.reshape(batch_size, num_tables, dim).transpose(0, 1).reshape(num_tables * batch_size, dim)


def _torch_row_grads(
    grad_output: torch.Tensor,
    offsets: torch.Tensor,
    bag: torch.Tensor,
    rows: torch.Tensor,
    num_tables: int,
    pooling: Pooling,
    per_sample_weights: torch.Tensor | None,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(unique rows (U,) sorted, their summed gradients (U, D) fp32)."""
    unique_rows, inverse = torch.unique(rows, sorted=True, return_inverse=True)
    per_id = _bag_gradients(grad_output, num_tables).float()[bag]  # (N, D)
    scale = id_scales(offsets, bag, pooling, per_sample_weights)
    if scale is not None:
        per_id = per_id * scale[:, None]
    grads = torch.zeros(unique_rows.numel(), per_id.shape[1], dtype=torch.float32, device=per_id.device)
    if deterministic:
        grads.index_put_((inverse,), per_id, accumulate=True)  # sort-based on CUDA: a fixed summation order
    else:
        grads.index_add_(0, inverse, per_id)
    return unique_rows, grads


def _row_grads(
    kernel: Kernel,
    grad_output: torch.Tensor,
    weights: torch.Tensor,
    offsets: torch.Tensor,
    row_offsets: torch.Tensor,
    bag: torch.Tensor,
    rows: torch.Tensor,
    pooling: Pooling,
    per_sample_weights: torch.Tensor | None,
    deterministic: bool,
    out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(unique rows (U,) sorted, their summed gradients (U, D) in `out_dtype`, summed in fp32) with the backend."""
    num_tables = row_offsets.numel() - 1
    if kernel is Kernel.TORCH:
        unique_rows, grads = _torch_row_grads(
            grad_output, offsets, bag, rows, num_tables, pooling, per_sample_weights, deterministic
        )
        return unique_rows, grads.to(out_dtype)
    backend = _triton_backend(weights.device)
    return backend.row_grads(
        grad_output, offsets, backend.sort_ids(bag, rows),
        dim=weights.shape[1], pooling=pooling, per_sample_weights=per_sample_weights, deterministic=deterministic,
        out_dtype=out_dtype,
    )  # fmt: skip


def _per_sample_weight_grads(
    kernel: Kernel,
    grad_output: torch.Tensor,
    weights: torch.Tensor,
    offsets: torch.Tensor,
    row_offsets: torch.Tensor,
    bag: torch.Tensor,
    rows: torch.Tensor,
    pooling: Pooling,
) -> torch.Tensor:
    """(N,) fp32 gradient of each per-sample weight: dot(grad_output[bag], weights[row]) (/ len for "mean")."""
    if kernel is Kernel.TRITON:
        return _triton_backend(weights.device).per_sample_weight_grads(
            grad_output, weights, offsets, bag, rows, pooling=pooling
        )
    per_id = _bag_gradients(grad_output, row_offsets.numel() - 1).float()[bag]  # (N, D)
    grads = (per_id * weights[rows].float()).sum(dim=1)
    scale = id_scales(offsets, bag, pooling, None)
    return grads if scale is None else grads * scale


def _bags_and_rows(
    kernel: Kernel, weights: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, row_offsets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) bag t*B+b and (N,) flat row of every id: one Triton pass (rows in int32 where they fit, which the
    backward sorts), or the reference's torch ops."""
    if kernel is Kernel.TRITON:
        return _triton_backend(weights.device).linearize(indices, offsets, row_offsets, weights.shape[0])
    return bag_and_row_of_ids(indices, offsets, row_offsets)


@dataclass(frozen=True)
class _Options:
    kernel: Kernel
    pooling: Pooling
    output_dtype: torch.dtype
    deterministic: bool
    sparse_grad: bool


class _EmbeddingBagFunction(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        weights: torch.Tensor,
        per_sample_weights: torch.Tensor | None,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        row_offsets: torch.Tensor,
        options: _Options,
    ) -> torch.Tensor:
        ctx.save_for_backward(weights, per_sample_weights, indices, offsets, row_offsets)
        ctx.options = options
        if options.kernel is Kernel.TORCH:
            return _torch_forward(
                weights, indices, offsets, row_offsets, options.pooling, per_sample_weights, options.output_dtype
            )
        return _triton_backend(weights.device).forward(
            weights, indices, offsets, row_offsets,
            pooling=options.pooling, per_sample_weights=per_sample_weights, output_dtype=options.output_dtype,
        )  # fmt: skip

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        weights, per_sample_weights, indices, offsets, row_offsets = ctx.saved_tensors
        options: _Options = ctx.options
        grad_output = grad_output.contiguous()
        bag, rows = _bags_and_rows(options.kernel, weights, indices, offsets, row_offsets)
        weights_grad = psw_grad = None
        if ctx.needs_input_grad[0]:
            unique_rows, grads = _row_grads(
                options.kernel, grad_output, weights, offsets, row_offsets, bag, rows,
                options.pooling, per_sample_weights, options.deterministic, out_dtype=weights.dtype,
            )  # fmt: skip
            weights_grad = _table_gradient(weights, unique_rows, grads, options.sparse_grad)
        if ctx.needs_input_grad[1]:
            psw_grad = _per_sample_weight_grads(
                options.kernel, grad_output, weights, offsets, row_offsets, bag, rows, options.pooling
            ).to(per_sample_weights.dtype)
        return weights_grad, psw_grad, None, None, None, None


def _table_gradient(
    weights: torch.Tensor, unique_rows: torch.Tensor, grads: torch.Tensor, sparse: bool
) -> torch.Tensor:
    """(R, D) gradient in the table dtype: sparse COO over the U unique rows (`grads` (U, D), table dtype), or dense."""
    values = grads
    if sparse:
        # Built from sorted unique rows: coalesced by construction, no invariant checks needed.
        return torch.sparse_coo_tensor(
            unique_rows[None], values, weights.shape, is_coalesced=True, check_invariants=False
        )
    dense = torch.zeros_like(weights)
    dense[unique_rows] = values  # rows are unique: a plain scatter, no accumulation
    return dense


def embedding_bag(
    weights: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    row_offsets: torch.Tensor | None = None,
    *,
    pooling: Pooling = "sum",
    per_sample_weights: torch.Tensor | None = None,
    output_dtype: torch.dtype | None = None,
    kernel: Kernel | None = None,
    deterministic: bool = False,
    sparse_grad: bool = True,
) -> torch.Tensor:
    """Pooled lookups of T tables in one call, differentiable w.r.t. `weights` and `per_sample_weights`.

    Args:
        weights: (R, D) fp32/bf16/fp16, all tables row-concatenated (pass the leaf parameter itself:
            its gradient is sparse by default).
        indices: (N,) int64 ids local to their table (KJT values).
        offsets: (T*B+1,) int64 (KJT offsets over tables x batch).
        row_offsets: (T+1,) int64 first row of each table in `weights`; None = one table of all R rows.
        pooling: "sum" or "mean" (an empty bag pools to zeros; weighted mean = sum(w_i * row_i) / len).
        per_sample_weights: (N,) float weight of each id, optional.
        output_dtype: None = the table dtype; e.g. torch.float32 for fp32 output from a bf16 table.
        kernel: the backend; None = TRITON on CUDA when available, else TORCH; FBGEMM on request.
        deterministic: a fixed summation order in the backward (TRITON always has one; FBGEMM refuses it).
        sparse_grad: return the table gradient as a sparse COO tensor (True) or dense (False).

    Returns:
        (B, T*D) pooled embeddings, table t in columns t*D:(t+1)*D; sums in fp32.

    Example:
        >>> weights = torch.arange(12.0).view(6, 2).requires_grad_()   # table 0: rows 0-3, table 1: rows 4-5
        >>> out = embedding_bag(
        ...     weights, torch.tensor([0, 3, 1, 1, 0]), torch.tensor([0, 2, 2, 4, 5]),
        ...     torch.tensor([0, 4, 6]), kernel=Kernel.TORCH)
        >>> out   # (B=2, T*D=4): bag (t0, b1) is empty
        tensor([[ 6.,  8., 20., 22.],
                [ 0.,  0.,  8.,  9.]], grad_fn=<_EmbeddingBagFunctionBackward>)
        >>> out.sum().backward()
        >>> weights.grad.coalesce().indices().tolist(), weights.grad.coalesce().values()[:, 0].tolist()
        ([[0, 3, 4, 5]], [1.0, 1.0, 1.0, 2.0])
    """
    row_offsets = _resolve_row_offsets(weights, row_offsets)
    _validate(weights, indices, offsets, row_offsets, pooling, per_sample_weights)
    out_dtype = output_dtype or weights.dtype
    if out_dtype not in _FLOAT_DTYPES:
        raise ValueError(f"output_dtype must be fp32, bf16, fp16 or None, got {output_dtype}")
    options = _Options(select_kernel(kernel, weights.device), pooling, out_dtype, deterministic, sparse_grad)
    if options.kernel is Kernel.FBGEMM:
        fbgemm_out: torch.Tensor = dispatch.fbgemm_backend("embedding_bag", weights.device).forward(
            weights, indices, offsets, row_offsets,
            pooling=pooling, per_sample_weights=per_sample_weights, output_dtype=out_dtype, sparse_grad=sparse_grad,
            deterministic=deterministic,
        )  # fmt: skip
        return fbgemm_out
    if _torch_autograd_suffices(options, weights, per_sample_weights):
        # torch's own embedding_bag backward gives exactly this dense gradient, and faster than the general path
        return _torch_forward(weights, indices, offsets, row_offsets, pooling, None, out_dtype)
    out: torch.Tensor = _EmbeddingBagFunction.apply(weights, per_sample_weights, indices, offsets, row_offsets, options)
    return out


def _torch_autograd_suffices(options: _Options, weights: torch.Tensor, per_sample_weights: torch.Tensor | None) -> bool:
    """TORCH backend, fp32 table, dense table gradient, no per-sample weights, fp32 output, no determinism asked.

    fp32 only: torch's backward sums duplicate ids in the table dtype, and bf16/fp16 sums drift (we sum in fp32).
    """
    return (
        options.kernel is Kernel.TORCH
        and weights.dtype == torch.float32
        and not options.sparse_grad
        and not options.deterministic
        and per_sample_weights is None
        and options.output_dtype == weights.dtype
    )


def embedding_bag_backward(
    grad_output: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    row_offsets: torch.Tensor | None = None,
    *,
    pooling: Pooling = "sum",
    per_sample_weights: torch.Tensor | None = None,
    kernel: Kernel | None = None,
    deterministic: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The row-sparse table gradient of `embedding_bag`, in fp32 (no autograd; for custom optimizers).

    Args: as in `fused_backward_update`.

    Returns:
        (unique rows (U,) int64 sorted, rows of the flat buffer; their summed gradients (U, D) fp32).
    """
    row_offsets = _resolve_row_offsets(weights, row_offsets)
    _validate_backward(grad_output, weights, indices, offsets, row_offsets, pooling, per_sample_weights)
    kernel = _select_unfused_kernel(kernel, weights.device, "embedding_bag_backward")
    bag, rows = _bags_and_rows(kernel, weights, indices, offsets, row_offsets)
    return _row_grads(
        kernel, grad_output.contiguous(), weights, offsets, row_offsets, bag, rows, pooling, per_sample_weights,
        deterministic,
    )  # fmt: skip


def _validate_backward(
    grad_output: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    row_offsets: torch.Tensor,
    pooling: str,
    per_sample_weights: torch.Tensor | None,
) -> None:
    num_tables, batch_size = _validate(weights, indices, offsets, row_offsets, pooling, per_sample_weights)
    if grad_output.shape != (batch_size, num_tables * weights.shape[1]) or grad_output.device != weights.device:
        raise ValueError(
            f"grad_output must be (B, T*D) = {(batch_size, num_tables * weights.shape[1])} on {weights.device}, "
            f"got {tuple(grad_output.shape)} on {grad_output.device}"
        )


def fused_backward_update(
    grad_output: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    row_offsets: torch.Tensor | None = None,
    *,
    optimizer: RowwiseOptimizer,
    state: OptimizerState | None = None,
    pooling: Pooling = "sum",
    per_sample_weights: torch.Tensor | None = None,
    kernel: Kernel | None = None,
    deterministic: bool = False,
) -> torch.Tensor | None:
    """Backward of `embedding_bag` fused with an optimizer step on the touched rows, in place (no autograd).

    The gradients of duplicate ids are summed first (in fp32), then each unique row r is updated once:
    - SGD: w[r] -= lr * g[r];
    - EXACT_ROWWISE_ADAGRAD (FBGEMM's): s[r] += mean(g[r]**2); w[r] -= lr * g[r] / (sqrt(s[r]) + eps);
    - ADAM (lazy, SparseAdam's): m[r] = b1 m[r] + (1-b1) g[r]; v[r] = b2 v[r] + (1-b2) g[r]**2;
      w[r] -= lr * (m[r] / (1 - b1**t)) / (sqrt(v[r] / (1 - b2**t)) + eps), t = `state.step` after this step;
    - ROWWISE_ADAM (FBGEMM's PARTIAL_ROWWISE_ADAM): the same with one v per row, of mean(g[r]**2).
    The math is fp32; rows are stored back in the table dtype, to nearest or (bf16, `stochastic_rounding`)
    stochastically.

    Args:
        grad_output: (B, T*D) gradient of the `embedding_bag` output.
        weights: (R, D) updated in place.
        indices, offsets, row_offsets, pooling, per_sample_weights, kernel: as in `embedding_bag`.
        optimizer: which update, with its hyperparameters.
        state: `optimizer.init_state(weights)` at the start, updated in place (its tensors and `step`); None for
            SGD without stochastic rounding.
        deterministic: the same result bit for bit on every run (TRITON: rows hit by more than a chunk of ids are
            summed in chunk order by one program, slower on Zipf-skewed ids; TORCH: a sort-based sum).

    Returns:
        (N,) gradient of `per_sample_weights` (computed with the weights before the update), or None.

    Example:
        >>> weights = torch.ones(4, 2)
        >>> opt = RowwiseOptimizer(OptimType.EXACT_ROWWISE_ADAGRAD, lr=0.5)
        >>> state = opt.init_state(weights)
        >>> grad_output = torch.full((1, 2), 2.0)   # B=1 bag holding row 1 twice
        >>> fused_backward_update(grad_output, weights, torch.tensor([1, 1]), torch.tensor([0, 2]),
        ...                       optimizer=opt, state=state, kernel=Kernel.TORCH)
        >>> state.momentum2.tolist(), weights[1].tolist()   # g = 4 per entry: s = 16, w = 1 - 0.5 * 4 / 4
        ([0.0, 16.0, 0.0, 0.0], [0.5, 0.5])
    """
    row_offsets = _resolve_row_offsets(weights, row_offsets)
    _validate_backward(grad_output, weights, indices, offsets, row_offsets, pooling, per_sample_weights)
    state = _checked_state(optimizer, state, weights)
    kernel = _select_unfused_kernel(kernel, weights.device, "fused_backward_update")
    grad_output = grad_output.contiguous()
    bag, rows = _bags_and_rows(kernel, weights, indices, offsets, row_offsets)
    psw_grad = None
    if per_sample_weights is not None:  # before the update: it needs the old rows
        psw_grad = _per_sample_weight_grads(kernel, grad_output, weights, offsets, row_offsets, bag, rows, pooling)
        psw_grad = psw_grad.to(per_sample_weights.dtype)
    state.step += 1
    with torch.no_grad():
        if kernel is Kernel.TORCH:
            _torch_update(grad_output, weights, state, offsets, row_offsets, bag, rows, pooling, per_sample_weights,
                          optimizer, deterministic)  # fmt: skip
        else:
            backend = _triton_backend(weights.device)
            rule = backend.UpdateRule(
                optimizer.optim.value, lr=optimizer.lr, eps=optimizer.eps, beta1=optimizer.beta1,
                beta2=optimizer.beta2, step=state.step, seed=state.seed, stochastic=optimizer.stochastic_rounding,
            )  # fmt: skip
            backend.fused_update(
                grad_output, weights, offsets, backend.sort_ids(bag, rows), rule,
                momentum1=state.momentum1, momentum2=state.momentum2, pooling=pooling,
                per_sample_weights=per_sample_weights, deterministic=deterministic,
            )  # fmt: skip
            # The kernels write through raw pointers: tell autograd the tensors changed.
            for tensor in (weights, state.momentum1, state.momentum2):
                if tensor is not None:
                    torch.autograd.graph.increment_version(tensor)
    return psw_grad


def _checked_state(optimizer: RowwiseOptimizer, state: OptimizerState | None, weights: torch.Tensor) -> OptimizerState:
    """`state` if it is the state `optimizer` keeps for `weights` (a fresh stateless one for plain SGD), else
    a ValueError naming what is wrong."""
    if optimizer.stochastic_rounding and weights.dtype != torch.bfloat16:
        raise ValueError(
            f"stochastic_rounding rounds updated rows to bf16, but the table is {weights.dtype}: "
            "use a bf16 table or stochastic_rounding=False"
        )
    expected = optimizer.init_state(weights.new_empty(0, weights.shape[1]))  # the shapes, without R rows of zeros
    if state is None:
        if expected.momentum1 is not None or expected.momentum2 is not None or optimizer.stochastic_rounding:
            raise ValueError(f"{optimizer.optim.name} needs state: pass state=optimizer.init_state(weights)")
        return expected
    for name in ("momentum1", "momentum2"):
        want, got = getattr(expected, name), getattr(state, name)
        if want is None and got is None:
            continue
        shape = None if want is None else (weights.shape[0], *want.shape[1:])
        if (
            want is None
            or got is None
            or got.shape != shape
            or got.dtype != torch.float32
            or not got.is_contiguous()
            or got.device != weights.device
        ):
            raise ValueError(
                f"state.{name} of {optimizer.optim.name} must be a contiguous fp32 tensor of shape {shape} on "
                f"{weights.device} (got {None if got is None else (tuple(got.shape), got.dtype, got.device)}): "
                "make it with optimizer.init_state(weights)"
            )
    return state


def _torch_update(
    grad_output: torch.Tensor,
    weights: torch.Tensor,
    state: OptimizerState,
    offsets: torch.Tensor,
    row_offsets: torch.Tensor,
    bag: torch.Tensor,
    rows: torch.Tensor,
    pooling: Pooling,
    per_sample_weights: torch.Tensor | None,
    optimizer: RowwiseOptimizer,
    deterministic: bool,
) -> None:
    unique_rows, grads = _torch_row_grads(
        grad_output, offsets, bag, rows, row_offsets.numel() - 1, pooling, per_sample_weights, deterministic
    )
    new_rows = weights[unique_rows].float()  # (U, D)
    optim = optimizer.optim
    if optim is OptimType.SGD:
        new_rows -= optimizer.lr * grads
    elif optim is OptimType.EXACT_ROWWISE_ADAGRAD:
        assert state.momentum2 is not None
        new_state = state.momentum2[unique_rows] + (grads * grads).mean(dim=1)  # (U,)
        state.momentum2[unique_rows] = new_state
        new_rows -= optimizer.lr * grads / (new_state.sqrt() + optimizer.eps)[:, None]
    else:
        assert state.momentum1 is not None and state.momentum2 is not None
        b1, b2 = optimizer.beta1, optimizer.beta2
        m = b1 * state.momentum1[unique_rows] + (1 - b1) * grads  # (U, D)
        second = grads * grads if optim is OptimType.ADAM else (grads * grads).mean(dim=1)
        v = b2 * state.momentum2[unique_rows] + (1 - b2) * second  # (U, D) or (U,)
        state.momentum1[unique_rows], state.momentum2[unique_rows] = m, v
        denom = (v / (1 - b2**state.step)).sqrt() + optimizer.eps
        new_rows -= optimizer.lr * (m / (1 - b1**state.step)) / (denom if v.ndim == 2 else denom[:, None])
    if optimizer.stochastic_rounding:
        generator = torch.Generator(weights.device).manual_seed((state.seed * 1_000_003 + state.step) % 2**31)
        weights[unique_rows] = reference.stochastic_round_to_bf16(new_rows, generator)
    else:
        weights[unique_rows] = new_rows.to(weights.dtype)
