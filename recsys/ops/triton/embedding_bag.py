# mypy: disable-error-code="no-untyped-def"
# (Triton kernels take untyped pointer arguments; the host wrappers below are typed.)
"""Triton kernels of the embedding-bag op (TBE style: many tables, one launch).

Dimension letters: T tables, B bags per table, D embedding dim, N ids, R rows of the flat weights
buffer, U unique rows touched by a batch. Layout: see `recsys.ops.reference.embedding_bag`.

Kernels:
    forward               grid (T*B, D-blocks): loops over its bag's ids in chunks of BLOCK_N, loads a
                          (BLOCK_N, BLOCK_D) tile of rows, accumulates in fp32.
    row grads             grid (U, D-blocks): one program per unique row sums the gradients of its ids
                          in sorted (stable) order, so the result is deterministic.
    fused update          grid (U,): the same segment sum over the whole row, then SGD or exact row-wise
                          Adagrad on that row, in place (each row belongs to exactly one program).
    per-sample weights    grid (N-blocks,): dot(grad_out[bag], row) per id.

Works with Triton 3.6 and 3.9 (only long-standing `tl` APIs). Under `TRITON_INTERPRET=1` (set before
`triton` is first imported) the kernels run on CPU in the interpreter, with one small autotune config
and small blocks so that tests with tiny shapes still cover the chunk loops and masks.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Largest D-block of the forward and row-gradient kernels (a wider D gets more programs).
MAX_BLOCK_D = 16 if INTERPRETED else 128
SEGMENT_BLOCK_N = 4 if INTERPRETED else 16


def _forward_configs() -> list[triton.Config]:
    if INTERPRETED:
        return [triton.Config({"BLOCK_N": 4}, num_warps=1)]
    # Few warps per bag: more bags resident per SM keep more row loads in flight (the op is latency-bound;
    # an H100 sweep at D=128 put 2 warps ahead of 4 and 8 for fp32 and bf16).
    return [
        triton.Config({"BLOCK_N": 16}, num_warps=2),
        triton.Config({"BLOCK_N": 32}, num_warps=2),
        triton.Config({"BLOCK_N": 32}, num_warps=4),
        triton.Config({"BLOCK_N": 64}, num_warps=4),
    ]


# Triton adds the dtypes of the tensor arguments (table, output, weights) to the tuning key itself.
@triton.autotune(configs=_forward_configs(), key=["D", "MEAN", "HAS_WEIGHTS"])
@triton.jit
def _forward_kernel(
    weights_ptr,  # (R, D) any float dtype, row stride `stride_w`
    indices_ptr,  # (N,) int64
    offsets_ptr,  # (T*B+1,) int64
    row_offsets_ptr,  # (T+1,) int64
    psw_ptr,  # (N,) per-sample weights (unused unless HAS_WEIGHTS)
    out_ptr,  # (B, T*D), row stride `stride_out`
    B,
    D,
    stride_w,
    stride_out,
    MEAN: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    bag = tl.program_id(0)  # t * B + b
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d < D
    t = bag // B
    b = bag - t * B
    start = tl.load(offsets_ptr + bag)
    end = tl.load(offsets_ptr + bag + 1)
    row_base = tl.load(row_offsets_ptr + t)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        rows = row_base + tl.load(indices_ptr + n, mask=n_mask, other=0)  # int64: tables can pass 2**31 elements
        tile = tl.load(
            weights_ptr + rows[:, None] * stride_w + d[None, :], mask=n_mask[:, None] & d_mask[None, :], other=0.0
        ).to(tl.float32)
        if HAS_WEIGHTS:
            w = tl.load(psw_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
            tile = tile * w[:, None]
        acc += tl.sum(tile, axis=0)
    if MEAN:
        acc = acc / tl.maximum(end - start, 1).to(tl.float32)
    out = out_ptr + b.to(tl.int64) * stride_out + t * D + d
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=d_mask)


@triton.jit
def _segment_grad(
    grad_ptr,  # (B, T*D) gradient of the output, row stride `stride_g`
    perm_ptr,  # (N,) int64: ids sorted by row (stable); read only for per-sample weights
    sorted_bag_ptr,  # (N,) int64: bag t*B+b of each id, in perm order (one dependent load less per id)
    offsets_ptr,
    psw_ptr,
    seg_start,
    seg_end,
    B,
    D,
    stride_g,
    d,
    d_mask,
    MEAN: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Sum over the ids perm[seg_start:seg_end] (one unique row) of scale_i * grad_out[bag_i], columns d (fp32)."""
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for j0 in range(seg_start, seg_end, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        j_mask = j < seg_end
        bag = tl.load(sorted_bag_ptr + j, mask=j_mask, other=0)
        t = bag // B
        b = bag - t * B
        scale = tl.where(j_mask, 1.0, 0.0)
        if HAS_WEIGHTS:
            i = tl.load(perm_ptr + j, mask=j_mask, other=0)
            scale = tl.load(psw_ptr + i, mask=j_mask, other=0.0).to(tl.float32)
        if MEAN:
            length = tl.load(offsets_ptr + bag + 1, mask=j_mask, other=1) - tl.load(
                offsets_ptr + bag, mask=j_mask, other=0
            )
            scale = scale / tl.maximum(length, 1).to(tl.float32)
        g = tl.load(
            grad_ptr + b[:, None] * stride_g + (t * D)[:, None] + d[None, :],
            mask=j_mask[:, None] & d_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(g * scale[:, None], axis=0)
    return acc


@triton.jit
def _row_grad_kernel(
    grad_ptr,
    perm_ptr,
    sorted_bag_ptr,
    offsets_ptr,
    psw_ptr,
    seg_offsets_ptr,  # (U+1,) int64: unique row u owns perm[seg_offsets[u]:seg_offsets[u+1]]
    out_ptr,  # (U, D) fp32, contiguous
    B,
    D,
    stride_g,
    MEAN: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    u = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = d < D
    seg_start = tl.load(seg_offsets_ptr + u)
    seg_end = tl.load(seg_offsets_ptr + u + 1)
    acc = _segment_grad(
        grad_ptr, perm_ptr, sorted_bag_ptr, offsets_ptr, psw_ptr, seg_start, seg_end, B, D, stride_g, d, d_mask,
        MEAN, HAS_WEIGHTS, BLOCK_N, BLOCK_D,
    )  # fmt: skip
    tl.store(out_ptr + u.to(tl.int64) * D + d, acc, mask=d_mask)


@triton.jit
def _fused_update_kernel(
    grad_ptr,
    perm_ptr,
    sorted_bag_ptr,
    offsets_ptr,
    psw_ptr,
    seg_offsets_ptr,
    unique_rows_ptr,  # (U,) int64 rows of the flat weights buffer
    weights_ptr,  # (R, D) updated in place
    state_ptr,  # (R,) fp32 row-wise Adagrad state, updated in place (unused unless ADAGRAD)
    B,
    D,
    stride_g,
    stride_w,
    lr,
    eps,
    MEAN: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    ADAGRAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,  # >= D: Adagrad needs the whole row's mean(g**2) before it updates
):
    u = tl.program_id(0)
    d = tl.arange(0, BLOCK_D)
    d_mask = d < D
    seg_start = tl.load(seg_offsets_ptr + u)
    seg_end = tl.load(seg_offsets_ptr + u + 1)
    g = _segment_grad(
        grad_ptr, perm_ptr, sorted_bag_ptr, offsets_ptr, psw_ptr, seg_start, seg_end, B, D, stride_g, d, d_mask,
        MEAN, HAS_WEIGHTS, BLOCK_N, BLOCK_D,
    )  # fmt: skip
    row = tl.load(unique_rows_ptr + u)
    w_ptrs = weights_ptr + row * stride_w + d
    w = tl.load(w_ptrs, mask=d_mask, other=0.0).to(tl.float32)
    if ADAGRAD:
        state = tl.load(state_ptr + row) + tl.sum(g * g, axis=0) / D
        tl.store(state_ptr + row, state)
        w = w - lr * g / (tl.sqrt(state) + eps)
    else:
        w = w - lr * g
    tl.store(w_ptrs, w.to(weights_ptr.dtype.element_ty), mask=d_mask)


@triton.jit
def _psw_grad_kernel(
    grad_ptr,
    weights_ptr,
    rows_ptr,  # (N,) int64 row of each id in the flat buffer
    bag_ptr,
    offsets_ptr,
    out_ptr,  # (N,) fp32
    N,
    B,
    D,
    stride_g,
    stride_w,
    MEAN: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    i = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    i_mask = i < N
    bag = tl.load(bag_ptr + i, mask=i_mask, other=0)
    row = tl.load(rows_ptr + i, mask=i_mask, other=0)
    t = bag // B
    b = bag - t * B
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + tl.arange(0, BLOCK_D)
        mask = i_mask[:, None] & (d < D)[None, :]
        g = tl.load(grad_ptr + b[:, None] * stride_g + (t * D)[:, None] + d[None, :], mask=mask, other=0.0)
        w = tl.load(weights_ptr + row[:, None] * stride_w + d[None, :], mask=mask, other=0.0)
        acc += tl.sum(g.to(tl.float32) * w.to(tl.float32), axis=1)
    if MEAN:
        length = tl.load(offsets_ptr + bag + 1, mask=i_mask, other=1) - tl.load(offsets_ptr + bag, mask=i_mask, other=0)
        acc = acc / tl.maximum(length, 1).to(tl.float32)
    tl.store(out_ptr + i, acc, mask=i_mask)


def _block_d(dim: int) -> int:
    return min(triton.next_power_of_2(max(dim, 1)), MAX_BLOCK_D)


def _segment_warps(block_d: int) -> int:
    """Warps of one unique row's program: most rows hold one or two ids, so the backward is latency-bound
    and small programs (more of them resident per SM) do better; wide rows need more warps for registers."""
    return 2 if block_d <= 128 else 4 if block_d <= 256 else 8


def forward(
    weights: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    row_offsets: torch.Tensor,
    *,
    pooling: str,
    per_sample_weights: torch.Tensor | None,
    output_dtype: torch.dtype,
) -> torch.Tensor:
    """(B, T*D) pooled lookups; arguments as in `recsys.ops.embedding_bag.embedding_bag` (already validated)."""
    num_tables = row_offsets.numel() - 1
    num_bags = offsets.numel() - 1
    batch_size = num_bags // num_tables
    dim = weights.shape[1]
    out = torch.empty(batch_size, num_tables * dim, dtype=output_dtype, device=weights.device)
    if out.numel() == 0:
        return out
    block_d = _block_d(dim)
    psw = per_sample_weights if per_sample_weights is not None else weights  # a placeholder never read
    _forward_kernel[(num_bags, triton.cdiv(dim, block_d))](
        weights, indices, offsets, row_offsets, psw, out,
        batch_size, dim, weights.stride(0), out.stride(0),
        MEAN=pooling == "mean", HAS_WEIGHTS=per_sample_weights is not None, BLOCK_D=block_d,
    )  # fmt: skip
    return out


def row_grads(
    grad_output: torch.Tensor,
    offsets: torch.Tensor,
    bag: torch.Tensor,
    perm: torch.Tensor,
    seg_offsets: torch.Tensor,
    *,
    dim: int,
    pooling: str,
    per_sample_weights: torch.Tensor | None,
) -> torch.Tensor:
    """(U, D) fp32 summed gradient of each unique row.

    Args:
        grad_output: (B, T*D) gradient of the output, unit stride in the last dim.
        offsets: (T*B+1,) int64.
        bag: (N,) int64 bag t*B+b of each id.
        perm: (N,) int64 ids sorted by their row (stable sort).
        seg_offsets: (U+1,) int64: unique row u owns perm[seg_offsets[u]:seg_offsets[u+1]].
    """
    num_unique = seg_offsets.numel() - 1
    out = torch.empty(num_unique, dim, dtype=torch.float32, device=grad_output.device)
    if out.numel() == 0:
        return out
    block_d = _block_d(dim)
    psw = per_sample_weights if per_sample_weights is not None else grad_output
    _row_grad_kernel[(num_unique, triton.cdiv(dim, block_d))](
        grad_output, perm, bag[perm], offsets, psw, seg_offsets, out,
        grad_output.shape[0], dim, grad_output.stride(0),
        MEAN=pooling == "mean", HAS_WEIGHTS=per_sample_weights is not None, BLOCK_N=SEGMENT_BLOCK_N, BLOCK_D=block_d,
        num_warps=_segment_warps(block_d),
    )  # fmt: skip
    return out


def fused_update(
    grad_output: torch.Tensor,
    weights: torch.Tensor,
    state: torch.Tensor | None,
    offsets: torch.Tensor,
    bag: torch.Tensor,
    perm: torch.Tensor,
    seg_offsets: torch.Tensor,
    unique_rows: torch.Tensor,
    *,
    pooling: str,
    per_sample_weights: torch.Tensor | None,
    lr: float,
    eps: float,
) -> None:
    """SGD (`state` None) or exact row-wise Adagrad on the U unique rows of `weights`, in place.

    Arguments as in `row_grads`, plus `unique_rows` (U,) int64 (sorted) and `state` (R,) fp32.
    """
    num_unique = unique_rows.numel()
    if num_unique == 0:
        return
    dim = weights.shape[1]
    block_d = triton.next_power_of_2(dim)
    # The whole row is one tile here: fewer ids per chunk and more warps for wide rows keep it in registers.
    block_n = SEGMENT_BLOCK_N if block_d <= 256 else 4
    psw = per_sample_weights if per_sample_weights is not None else grad_output
    _fused_update_kernel[(num_unique,)](
        grad_output, perm, bag[perm], offsets, psw, seg_offsets, unique_rows, weights,
        state if state is not None else weights,
        grad_output.shape[0], dim, grad_output.stride(0), weights.stride(0), lr, eps,
        MEAN=pooling == "mean", HAS_WEIGHTS=per_sample_weights is not None, ADAGRAD=state is not None,
        BLOCK_N=block_n, BLOCK_D=block_d, num_warps=_segment_warps(block_d),
    )  # fmt: skip


def per_sample_weight_grads(
    grad_output: torch.Tensor,
    weights: torch.Tensor,
    offsets: torch.Tensor,
    bag: torch.Tensor,
    rows: torch.Tensor,
    *,
    pooling: str,
) -> torch.Tensor:
    """(N,) fp32: dot(grad_output[bag_i], weights[rows_i]), divided by the bag length for "mean"."""
    num_ids = rows.numel()
    out = torch.empty(num_ids, dtype=torch.float32, device=weights.device)
    if num_ids == 0:
        return out
    block_n = SEGMENT_BLOCK_N
    _psw_grad_kernel[(triton.cdiv(num_ids, block_n),)](
        grad_output, weights, rows, bag, offsets, out,
        num_ids, grad_output.shape[0], weights.shape[1], grad_output.stride(0), weights.stride(0),
        MEAN=pooling == "mean", BLOCK_N=block_n, BLOCK_D=_block_d(weights.shape[1]),
    )  # fmt: skip
    return out
