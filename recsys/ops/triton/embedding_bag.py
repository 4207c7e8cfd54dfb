# mypy: disable-error-code="no-untyped-def"
# (Triton kernels take untyped pointer arguments; the host wrappers below are typed.)
"""Triton kernels of the embedding-bag op (TBE style: many tables, one launch).

Dimension letters: T tables, B bags per table, D embedding dim, N ids, R rows of the flat weights
buffer, U unique rows touched by a batch, C chunks of BLOCK_N sorted ids. Layout: see
`recsys.ops.reference.embedding_bag`.

Kernels:
    forward               grid (T*B, D-blocks): loops over its bag's ids in chunks of BLOCK_N, loads a
                          (BLOCK_N, BLOCK_D) tile of rows, accumulates in fp32.
    backward, pass 1      grid (C,), over the ids sorted by row (a radix sort on the host; a run of equal
    (`_chunk_kernel`)     rows = one unique row's ids). Program c gathers the output-gradient rows of its
                          BLOCK_N ids in one (BLOCK_N, D) tile (every load independent: bandwidth, not
                          latency) and sums each run with a segmented scan. A run inside the chunk is a
                          whole row gradient: written out (row gradients) or applied to the row at once
                          (fused update: SGD, row-wise Adagrad, Adam, row-wise Adam). A run crossing the
                          chunk's edge leaves its piece in a small (C, D) buffer.
    backward, pass 2      grid (C,): the program of the chunk where such a run starts (its head) sums the
    (`_span_kernel`)      run's pieces and writes or applies its gradient. Others exit at once.
    per-sample weights    grid (N-blocks,): dot(grad_out[bag], row) per id.

So a hot row (Zipf head ids) is spread over as many programs as it has chunks of ids, and every row is
updated exactly once, by one program: no races on the table or the optimizer state. Pieces reach their
head by fp32 atomic adds, so a row with ids in three or more chunks (more than BLOCK_N + 1 ids) gets its
pieces summed in an order that can vary between runs; `deterministic=True` stores the pieces in slots
instead and the head sums them in chunk order (one program walks a hot row's pieces: slower on Zipf ids).
Runs inside a chunk are always summed in sorted-id order (the sort is stable).

Works with Triton 3.6 and 3.9 (only long-standing `tl` APIs). Under `TRITON_INTERPRET=1` (set before
`triton` is first imported) the kernels run on CPU in the interpreter, with one small config and small
blocks so that tests with tiny shapes still cover the chunk loops, runs crossing chunks and the masks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Largest D-block of the forward and row-gradient kernels (a wider D gets more programs).
MAX_BLOCK_D = 16 if INTERPRETED else 128
PSW_BLOCK_N = 4 if INTERPRETED else 16  # ids per program of the per-sample-weight gradient
LINEARIZE_BLOCK_N = 4 if INTERPRETED else 32  # ids per step of `linearize`'s programs (one per bag)
MIN_BLOCK_N = 4 if INTERPRETED else 8  # the smallest chunk of sorted ids (`_chunk_configs`)
CHUNK_TILE = 8192  # most elements of a chunk's (BLOCK_N, BLOCK_D) fp32 tile: it and its scan stay in registers
SPAN_BLOCK_K = 4 if INTERPRETED else 64  # pieces a deterministic head sums per step


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
def _linearize_kernel(
    indices_ptr,  # (N,) int64 ids local to their table
    offsets_ptr,  # (T*B+1,) int64
    row_offsets_ptr,  # (T+1,) int64
    bag_ptr,  # (N,) int32 out: the bag of every id
    rows_ptr,  # (N,) int32/int64 out: the row of every id in the flat buffer
    B,
    BLOCK_N: tl.constexpr,
):
    """Program t*B+b: the bag and the flat row of each of its ids (what the backward sorts)."""
    bag = tl.program_id(0)
    start = tl.load(offsets_ptr + bag)
    end = tl.load(offsets_ptr + bag + 1)
    base = tl.load(row_offsets_ptr + bag // B)
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        mask = n < end
        rows = base + tl.load(indices_ptr + n, mask=mask, other=0)
        tl.store(rows_ptr + n, rows.to(rows_ptr.dtype.element_ty), mask=mask)
        tl.store(bag_ptr + n, tl.zeros([BLOCK_N], dtype=tl.int32) + bag, mask=mask)


# Optimizers of the fused update (`OPTIM`): the codes `fused_update` passes.
SGD: tl.constexpr = tl.constexpr(0)
ROWWISE_ADAGRAD: tl.constexpr = tl.constexpr(1)
ADAM: tl.constexpr = tl.constexpr(2)
ROWWISE_ADAM: tl.constexpr = tl.constexpr(3)
OPTIM_CODES = {"sgd": 0, "exact_rowwise_adagrad": 1, "adam": 2, "rowwise_adam": 3}


@triton.jit
def _segmented_add(a, a_starts, b, b_starts):
    """Combine of a segmented inclusive sum: the sum restarts where a run of equal rows starts."""
    return tl.where(b_starts != 0, b, a + b), a_starts | b_starts


@triton.jit
def _id_grads(
    grad_ptr,
    sorted_bag_ptr,
    perm_ptr,
    offsets_ptr,
    psw_ptr,
    j,
    valid,
    B,
    D,
    stride_g,
    d,
    d_mask,
    MEAN: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
):
    """(BLOCK_N, BLOCK_D) fp32: scale_j * grad_out[bag_j] of the sorted ids j, 0 where not `valid`."""
    bag = tl.load(sorted_bag_ptr + j, mask=valid, other=0).to(tl.int64)
    t = bag // B
    b = bag - t * B
    g = tl.load(
        grad_ptr + b[:, None] * stride_g + (t * D)[:, None] + d[None, :],
        mask=valid[:, None] & d_mask[None, :],
        other=0.0,
    ).to(tl.float32)
    if HAS_WEIGHTS:
        i = tl.load(perm_ptr + j, mask=valid, other=0)
        g = g * tl.load(psw_ptr + i, mask=valid, other=0.0).to(tl.float32)[:, None]
    if MEAN:
        length = tl.load(offsets_ptr + bag + 1, mask=valid, other=1) - tl.load(offsets_ptr + bag, mask=valid, other=0)
        g = g / tl.maximum(length, 1).to(tl.float32)[:, None]
    return g


@triton.jit
def _store_row_grads(g, rows, mask, u, out_ptr, unique_rows_ptr, D, d, d_mask):
    """Write the summed gradients `g` (M, BLOCK_D) of `rows` (M,) as unique rows `u` (M,) of the output."""
    tl.store(
        out_ptr + u[:, None] * D + d[None, :], g.to(out_ptr.dtype.element_ty), mask=mask[:, None] & d_mask[None, :]
    )
    tl.store(unique_rows_ptr + u, rows, mask=mask)


@triton.jit
def _update_rows(
    g,
    rows,
    mask,
    weights_ptr,
    m1_ptr,
    m2_ptr,
    D,
    stride_w,
    d,
    d_mask,
    lr,
    eps,
    beta1,
    beta2,
    bias_correction1,
    bias_correction2,
    seed,
    OPTIM: tl.constexpr,
    STOCHASTIC: tl.constexpr,
):
    """Apply the optimizer to `rows` (M,) with their whole gradients `g` (M, BLOCK_D), in place; fp32 math."""
    both = mask[:, None] & d_mask[None, :]
    w_ptrs = weights_ptr + rows[:, None] * stride_w + d[None, :]
    w = tl.load(w_ptrs, mask=both, other=0.0).to(tl.float32)
    if OPTIM == SGD:
        w = w - lr * g
    elif OPTIM == ROWWISE_ADAGRAD:
        state = tl.load(m2_ptr + rows, mask=mask, other=0.0) + tl.sum(g * g, axis=1) / D
        tl.store(m2_ptr + rows, state, mask=mask)
        w = w - lr * g / (tl.sqrt(state) + eps)[:, None]
    else:
        m_ptrs = m1_ptr + rows[:, None] * D + d[None, :]
        m = beta1 * tl.load(m_ptrs, mask=both, other=0.0) + (1.0 - beta1) * g
        tl.store(m_ptrs, m, mask=both)
        if OPTIM == ADAM:
            v_ptrs = m2_ptr + rows[:, None] * D + d[None, :]
            v = beta2 * tl.load(v_ptrs, mask=both, other=0.0) + (1.0 - beta2) * g * g
            tl.store(v_ptrs, v, mask=both)
            denom = tl.sqrt(v / bias_correction2) + eps
        else:
            v = beta2 * tl.load(m2_ptr + rows, mask=mask, other=0.0) + (1.0 - beta2) * tl.sum(g * g, axis=1) / D
            tl.store(m2_ptr + rows, v, mask=mask)
            denom = (tl.sqrt(v / bias_correction2) + eps)[:, None]
        w = w - lr * (m / bias_correction1) / denom
    if STOCHASTIC:  # bf16 tables: add 16 random low bits, then truncate them (unbiased rounding)
        noise = (tl.randint(seed, (rows[:, None] * D + d[None, :]).to(tl.int32)) & 0xFFFF).to(tl.uint32)
        w = (((w.to(tl.uint32, bitcast=True) + noise) >> 16) << 16).to(tl.float32, bitcast=True)
    tl.store(w_ptrs, w.to(weights_ptr.dtype.element_ty), mask=both)


@triton.jit(do_not_specialize=["size_class"])
def _chunk_kernel(
    grad_ptr,  # (B, T*D) output gradient, row stride `stride_g`
    sorted_rows_ptr,  # (N,) int32/int64 row of every id, ascending
    sorted_bag_ptr,  # (N,) int32 bag t*B+b of every sorted id
    run_starts_ptr,  # (N / MIN_BLOCK_N,) int64: where the run of sorted id k * MIN_BLOCK_N starts
    perm_ptr,  # (N,) int64 position of every sorted id in `indices` (per-sample weights only)
    offsets_ptr,  # (T*B+1,) int64 (mean pooling only)
    psw_ptr,  # (N,) per-sample weights in `indices` order (only with HAS_WEIGHTS)
    unique_index_ptr,  # (N,) unique-row number of every sorted id (row gradients only)
    out_ptr,  # (U, D) row gradients (row gradients only)
    unique_rows_ptr,  # (U,) int64 rows of the output's rows (row gradients only)
    weights_ptr,  # (R, D) updated in place (UPDATE only)
    m1_ptr,  # (R, D) fp32 first moments (Adam family)
    m2_ptr,  # (R,) or (R, D) fp32 second moments / Adagrad sums
    span_ptr,  # pieces of rows whose ids cross a chunk edge: (C, BLOCK_D) zeroed, or (2C, BLOCK_D) DETERMINISTIC
    N,
    size_class,  # log2 of N, rounded up: chunk sizes are tuned per size class (unused in the body)
    B,
    D,
    stride_g,
    stride_w,
    lr,
    eps,
    beta1,
    beta2,
    bias_correction1,
    bias_correction2,
    seed,
    MEAN: tl.constexpr,
    HAS_WEIGHTS: tl.constexpr,
    UPDATE: tl.constexpr,
    OPTIM: tl.constexpr,
    STOCHASTIC: tl.constexpr,
    DETERMINISTIC: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MIN_BLOCK_N: tl.constexpr,  # the smallest BLOCK_N of the configs (`run_starts`' spacing)
):
    """Program c: the sorted ids c*BLOCK_N ... (c+1)*BLOCK_N - 1 (a chunk). Their output-gradient rows are
    gathered in one tile and summed per run of equal rows by a segmented scan; a run that lies in the chunk is a
    whole row gradient, written (or applied) here; a run crossing the chunk's edge leaves its piece in `span`
    for `_span_kernel`."""
    c = tl.program_id(0)
    i = tl.arange(0, BLOCK_N)
    first = c.to(tl.int64) * BLOCK_N
    j = first + i
    valid = j < N
    d = tl.arange(0, BLOCK_D)
    d_mask = d < D
    row = tl.load(sorted_rows_ptr + j, mask=valid, other=-1).to(tl.int64)
    prev_row = tl.load(sorted_rows_ptr + j - 1, mask=valid & (j > 0), other=-1).to(tl.int64)
    next_row = tl.load(sorted_rows_ptr + j + 1, mask=j + 1 < N, other=-1).to(tl.int64)
    starts = row != prev_row  # a run of the row's ids starts at j
    ends = valid & (row != next_row)  # ... ends at j

    g = _id_grads(grad_ptr, sorted_bag_ptr, perm_ptr, offsets_ptr, psw_ptr, j, valid, B, D, stride_g, d, d_mask,
                  MEAN, HAS_WEIGHTS)  # fmt: skip
    local_starts = starts | (i == 0)
    flags = tl.broadcast_to(local_starts[:, None], (BLOCK_N, BLOCK_D)).to(tl.int32)
    sums, _ = tl.associative_scan((g, flags), 0, _segmented_add)  # at a run's last id: the run's sum

    first_row = tl.load(sorted_rows_ptr + first).to(tl.int64)
    # the chunk's first run began in an earlier chunk (so its first run is only a piece of the row's ids)
    first_continues = first_row == tl.load(sorted_rows_ptr + first - 1, mask=first > 0, other=-1).to(tl.int64)
    # (an integer product, not `&` with the scalar: Triton's interpreter mishandles splatted booleans)
    continued = tl.cumsum(local_starts.to(tl.int32), 0) * first_continues.to(tl.int32) == 1
    last = tl.minimum(N - first, BLOCK_N) - 1
    run_end = valid & (ends | (i == last))  # where this chunk's part of a run ends
    whole = run_end & ends & ~continued  # ... and the whole run is in this chunk
    piece = run_end & ~whole

    if UPDATE:
        _update_rows(sums, row, whole, weights_ptr, m1_ptr, m2_ptr, D, stride_w, d, d_mask,
                     lr, eps, beta1, beta2, bias_correction1, bias_correction2, seed, OPTIM, STOCHASTIC)  # fmt: skip
    else:
        u = tl.load(unique_index_ptr + j, mask=whole, other=0).to(tl.int64)
        _store_row_grads(sums, row, whole, u, out_ptr, unique_rows_ptr, D, d, d_mask)

    piece_mask = piece[:, None] & d_mask[None, :]
    if DETERMINISTIC:  # slot 2c: the piece continuing an earlier chunk's run; 2c + 1: the one going on after c
        slot = 2 * c + tl.where(continued, 0, 1)
        tl.store(span_ptr + slot[:, None] * BLOCK_D + d[None, :], sums, mask=piece_mask)
    else:  # every piece adds itself to the slot of the chunk its run starts in (its head)
        head = c.to(tl.int64)
        if first_continues:
            head = tl.load(run_starts_ptr + c * (BLOCK_N // MIN_BLOCK_N)) // BLOCK_N
        head = tl.where(continued, head, c)
        tl.atomic_add(span_ptr + head[:, None] * BLOCK_D + d[None, :], sums, mask=piece_mask)


@triton.jit
def _span_kernel(
    sorted_rows_ptr,
    unique_index_ptr,
    out_ptr,
    unique_rows_ptr,
    weights_ptr,
    m1_ptr,
    m2_ptr,
    span_ptr,
    N,
    D,
    stride_w,
    num_chunks,
    lr,
    eps,
    beta1,
    beta2,
    bias_correction1,
    bias_correction2,
    seed,
    UPDATE: tl.constexpr,
    OPTIM: tl.constexpr,
    STOCHASTIC: tl.constexpr,
    DETERMINISTIC: tl.constexpr,
    BLOCK_N: tl.constexpr,  # the chunks' size in `_chunk_kernel`
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,  # pieces summed per step (DETERMINISTIC)
):
    """Program c: if a run of ids starts in chunk c and goes on past it (its head), sum its pieces (in chunk
    order when DETERMINISTIC) and write or apply the row's gradient."""
    c = tl.program_id(0)
    first = c.to(tl.int64) * BLOCK_N
    last = tl.minimum(N, first + BLOCK_N) - 1
    row = tl.load(sorted_rows_ptr + last).to(tl.int64)
    goes_on = tl.load(sorted_rows_ptr + last + 1, mask=last + 1 < N, other=-1).to(tl.int64) == row
    first_row = tl.load(sorted_rows_ptr + first).to(tl.int64)
    before = tl.load(sorted_rows_ptr + first - 1, mask=first > 0, other=-1).to(tl.int64)
    starts_here = (first_row != row) | (before != row)
    if goes_on & starts_here:
        d = tl.arange(0, BLOCK_D)
        d_mask = d < D
        if DETERMINISTIC:
            total = tl.load(span_ptr + (2 * c + 1).to(tl.int64) * BLOCK_D + d, mask=d_mask, other=0.0)
            k = c.to(tl.int64) + 1
            more = k < num_chunks
            while more:
                ks = k + tl.arange(0, BLOCK_K)
                inside = (ks < num_chunks) & (
                    tl.load(sorted_rows_ptr + ks * BLOCK_N, mask=ks < num_chunks, other=-1).to(tl.int64) == row
                )
                pieces = tl.load(
                    span_ptr + (2 * ks)[:, None] * BLOCK_D + d[None, :],
                    mask=inside[:, None] & d_mask[None, :],
                    other=0.0,
                )
                total += tl.sum(pieces, axis=0)
                more = tl.sum(inside.to(tl.int32)) == BLOCK_K
                k += BLOCK_K
        else:
            total = tl.load(span_ptr + c.to(tl.int64) * BLOCK_D + d, mask=d_mask, other=0.0)
        rows = tl.full([1], 0, tl.int64) + row
        one = rows >= 0  # (1,) True
        if UPDATE:
            _update_rows(total[None, :], rows, one, weights_ptr, m1_ptr, m2_ptr, D, stride_w, d, d_mask, lr, eps,
                         beta1, beta2, bias_correction1, bias_correction2, seed, OPTIM, STOCHASTIC)  # fmt: skip
        else:
            u = tl.full([1], 0, tl.int64) + tl.load(unique_index_ptr + last).to(tl.int64)
            _store_row_grads(total[None, :], rows, one, u, out_ptr, unique_rows_ptr, D, d, d_mask)


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
    bag = tl.load(bag_ptr + i, mask=i_mask, other=0).to(tl.int64)
    row = tl.load(rows_ptr + i, mask=i_mask, other=0).to(tl.int64)
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


def linearize(
    indices: torch.Tensor, offsets: torch.Tensor, row_offsets: torch.Tensor, num_rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """((N,) int32 bag t*B+b of every id, (N,) its row in the flat buffer: int32 when R < 2**31, else int64)."""
    num_bags = offsets.numel() - 1
    row_dtype = torch.int32 if num_rows <= torch.iinfo(torch.int32).max else torch.int64
    bag = torch.empty(indices.numel(), dtype=torch.int32, device=indices.device)
    rows = torch.empty(indices.numel(), dtype=row_dtype, device=indices.device)
    if indices.numel():
        _linearize_kernel[(num_bags,)](
            indices,
            offsets,
            row_offsets,
            bag,
            rows,
            num_bags // (row_offsets.numel() - 1),
            BLOCK_N=LINEARIZE_BLOCK_N,
            num_warps=1,  # one small program per bag
        )
    return bag, rows


@dataclass(frozen=True)
class SortedIds:
    """A batch's ids sorted by their row: each run of equal rows holds the ids of one unique row."""

    rows: torch.Tensor  # (N,) ascending, the dtype `linearize` gave (int32: a radix sort of half the passes)
    bag: torch.Tensor  # (N,) int32 bag t*B+b of each sorted id
    perm: torch.Tensor  # (N,) int64 position of each sorted id in `indices`
    # (ceil(N / MIN_BLOCK_N),) int64: where the run holding sorted id k * MIN_BLOCK_N starts, so that a chunk whose
    # first run began earlier finds that run's head chunk with one load
    run_starts: torch.Tensor


def sort_ids(bag: torch.Tensor, rows: torch.Tensor) -> SortedIds:
    """The ids (`linearize`'s bag and rows) sorted by row; stable, so a run's ids keep one order every time."""
    sorted_rows, perm = torch.sort(rows, stable=True)
    run_starts = torch.searchsorted(sorted_rows, sorted_rows[::MIN_BLOCK_N])
    return SortedIds(sorted_rows, bag[perm], perm, run_starts)


def _unique_numbers(sorted_rows: torch.Tensor) -> tuple[torch.Tensor, int]:
    """((N,) the number of each sorted id's unique row, 0..U-1; U). Reading U synchronises the device."""
    starts = torch.ones(sorted_rows.shape, dtype=torch.bool, device=sorted_rows.device)
    torch.ne(sorted_rows[1:], sorted_rows[:-1], out=starts[1:])
    numbers = torch.cumsum(starts, dim=0, dtype=torch.int32 if starts.numel() < 2**31 else torch.int64) - 1
    return numbers, int(numbers[-1]) + 1


def _chunk_configs() -> list[triton.Config]:
    if INTERPRETED:
        return [triton.Config({"BLOCK_N": MIN_BLOCK_N}, num_warps=1)]
    # Small programs win (an H100 sweep at D=128: 16 ids on 2 warps ahead of 32 / 64 ids on 4 / 8 warps): many
    # resident per SM keep the most gradient rows in flight.
    return [triton.Config({"BLOCK_N": n}, num_warps=w) for n, w in ((8, 1), (8, 2), (16, 2), (16, 4), (32, 4))]


def _fitting_configs(configs: list[triton.Config], named_args: dict[str, Any], **kwargs: Any) -> list[triton.Config]:
    """The chunk sizes whose (BLOCK_N, BLOCK_D) fp32 tile (and its scan flags) stays in registers."""
    fitting = [c for c in configs if c.kwargs["BLOCK_N"] * kwargs["BLOCK_D"] <= CHUNK_TILE]
    return fitting or [min(configs, key=lambda c: c.kwargs["BLOCK_N"])]


# Row gradients are tuned on the batch itself, once per size class (they write only their own output); a fused update
# changes the table, so it runs with the chunk size tuned for the row gradients of the same shape (tuning them first
# if needed).
_chunk_tuned = triton.autotune(
    configs=_chunk_configs(), key=["D", "MEAN", "HAS_WEIGHTS", "DETERMINISTIC", "size_class"],
    reset_to_zero=["span_ptr"],
    prune_configs_by={"early_config_prune": _fitting_configs},
)(_chunk_kernel)  # fmt: skip
_TUNED: dict[tuple[Any, ...], triton.Config] = {}


@dataclass(frozen=True)
class _Batch:
    """What both backward kernels read of a batch."""

    grad_output: torch.Tensor  # (B, T*D), unit stride in D
    offsets: torch.Tensor  # (T*B+1,) int64
    ids: SortedIds
    per_sample_weights: torch.Tensor | None
    dim: int
    pooling: str
    deterministic: bool

    @property
    def block_d(self) -> int:
        return triton.next_power_of_2(self.dim)  # whole rows: a row-wise optimizer needs all of it

    def tuning_key(self, out_dtype: torch.dtype) -> tuple[Any, ...]:
        """What the row-gradient autotuner keys its choice on (its key plus the dtypes of the tensors it gets)."""
        weights = self.per_sample_weights
        return (self.dim, self.pooling, None if weights is None else weights.dtype, self.deterministic,
                self.size_class, self.grad_output.dtype, self.ids.rows.dtype, out_dtype)  # fmt: skip

    @property
    def size_class(self) -> int:
        """The batch's size class, ceil(log2(N)): a chunk size tuned on a small batch does not serve a large one."""
        return (self.ids.rows.numel() - 1).bit_length()

    def span(self, block_n: int) -> torch.Tensor:
        """The buffer of pieces of runs crossing chunk edges (zeroed: pieces add themselves to their head's slot)."""
        chunks = triton.cdiv(self.ids.rows.numel(), block_n)
        if self.deterministic:
            return torch.empty(2 * chunks, self.block_d, dtype=torch.float32, device=self.grad_output.device)
        return torch.zeros(chunks, self.block_d, dtype=torch.float32, device=self.grad_output.device)

    def chunk_args(self) -> tuple[Any, ...]:
        psw = self.per_sample_weights if self.per_sample_weights is not None else self.grad_output  # never read
        ids = self.ids
        return (self.grad_output, ids.rows, ids.bag, ids.run_starts, ids.perm, self.offsets, psw)

    def sizes(self) -> dict[str, Any]:
        return {"N": self.ids.rows.numel(), "size_class": self.size_class, "B": self.grad_output.shape[0],
                "D": self.dim, "stride_g": self.grad_output.stride(0)}  # fmt: skip

    def flags(self) -> dict[str, Any]:
        return {"MEAN": self.pooling == "mean", "HAS_WEIGHTS": self.per_sample_weights is not None,
                "DETERMINISTIC": self.deterministic, "BLOCK_D": self.block_d, "MIN_BLOCK_N": MIN_BLOCK_N}  # fmt: skip


@dataclass(frozen=True)
class UpdateRule:
    """One fused optimizer step: which optimizer, its hyperparameters and this step's number (from 1)."""

    optim: str  # a key of OPTIM_CODES
    lr: float
    eps: float
    beta1: float
    beta2: float
    step: int
    seed: int  # stochastic rounding's stream (with `step`)
    stochastic: bool

    def args(self) -> dict[str, Any]:
        return {
            "lr": self.lr, "eps": self.eps, "beta1": self.beta1, "beta2": self.beta2,
            "bias_correction1": 1.0 - self.beta1**self.step, "bias_correction2": 1.0 - self.beta2**self.step,
            "seed": (self.seed * 1_000_003 + self.step) % 2**31,
            "OPTIM": OPTIM_CODES[self.optim], "STOCHASTIC": self.stochastic,
        }  # fmt: skip


_NO_UPDATE = UpdateRule("sgd", lr=0.0, eps=0.0, beta1=0.0, beta2=0.0, step=1, seed=0, stochastic=False)


def row_grads(
    grad_output: torch.Tensor,
    offsets: torch.Tensor,
    ids: SortedIds,
    *,
    dim: int,
    pooling: str,
    per_sample_weights: torch.Tensor | None,
    deterministic: bool,
    out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """((U,) int64 unique rows, ascending; (U, D) their summed gradients in `out_dtype`, fp32 sums).

    Args:
        grad_output: (B, T*D) gradient of the output, unit stride in D.
        offsets: (T*B+1,) int64.
        ids: the batch's ids sorted by row (`sort_ids`).
        deterministic: rows hit by more than BLOCK_N + 1 ids are summed in a fixed order too (see the module).
    """
    batch = _Batch(grad_output, offsets, ids, per_sample_weights, dim, pooling, deterministic)
    device = grad_output.device
    if ids.rows.numel() == 0:
        return torch.empty(0, dtype=torch.int64, device=device), torch.empty(0, dim, dtype=out_dtype, device=device)
    numbers, num_unique = _unique_numbers(ids.rows)
    out = torch.empty(num_unique, dim, dtype=out_dtype, device=device)
    unique_rows = torch.empty(num_unique, dtype=torch.int64, device=device)
    known = _TUNED.get(batch.tuning_key(out_dtype))
    span = batch.span(known.kwargs["BLOCK_N"] if known else MIN_BLOCK_N)
    n = ids.rows.numel()
    _chunk_tuned[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
        *batch.chunk_args(), numbers, out, unique_rows, grad_output, grad_output, grad_output, span,
        stride_w=0, **batch.sizes(), **_NO_UPDATE.args(), UPDATE=False, **batch.flags(),
    )  # fmt: skip
    config = _chunk_tuned.best_config
    _TUNED[batch.tuning_key(out_dtype)] = config
    _spans(batch, config, span, numbers, out, unique_rows, grad_output, None, None, _NO_UPDATE, update=False)
    return unique_rows, out


def fused_update(
    grad_output: torch.Tensor,
    weights: torch.Tensor,
    offsets: torch.Tensor,
    ids: SortedIds,
    rule: UpdateRule,
    *,
    momentum1: torch.Tensor | None,
    momentum2: torch.Tensor | None,
    pooling: str,
    per_sample_weights: torch.Tensor | None,
    deterministic: bool,
) -> None:
    """Apply `rule` to every touched row of `weights` (R, D) once, with its whole gradient, in place.

    Args: as in `row_grads`, plus `momentum1` (R, D) fp32 (Adam family) and `momentum2` ((R,) row-wise, (R, D)
    Adam) fp32 state, updated in place.
    """
    batch = _Batch(grad_output, offsets, ids, per_sample_weights, weights.shape[1], pooling, deterministic)
    if ids.rows.numel() == 0:
        return
    config = _TUNED.get(batch.tuning_key(torch.float32))
    if config is None:  # tune the chunk size on this batch's row gradients (they leave the table alone)
        row_grads(grad_output, offsets, ids, dim=batch.dim, pooling=pooling, per_sample_weights=per_sample_weights,
                  deterministic=deterministic)  # fmt: skip
        config = _TUNED[batch.tuning_key(torch.float32)]
    block_n = config.kwargs["BLOCK_N"]
    span = batch.span(block_n)
    m1 = momentum1 if momentum1 is not None else weights  # placeholders are never read
    m2 = momentum2 if momentum2 is not None else weights
    _chunk_kernel[(triton.cdiv(ids.rows.numel(), block_n),)](
        *batch.chunk_args(), ids.rows, weights, ids.rows, weights, m1, m2, span,
        stride_w=weights.stride(0), **batch.sizes(), **rule.args(), UPDATE=True, **batch.flags(),
        BLOCK_N=block_n, num_warps=config.num_warps,
    )  # fmt: skip
    _spans(batch, config, span, ids.rows, weights, ids.rows, weights, m1, m2, rule, update=True)


def _spans(
    batch: _Batch,
    config: triton.Config,
    span: torch.Tensor,
    numbers: torch.Tensor,
    out: torch.Tensor,
    unique_rows: torch.Tensor,
    weights: torch.Tensor,
    momentum1: torch.Tensor | None,
    momentum2: torch.Tensor | None,
    rule: UpdateRule,
    *,
    update: bool,
) -> None:
    """Second pass: the rows whose ids crossed a chunk edge, one program per chunk (most exit at once)."""
    n = batch.ids.rows.numel()
    block_n = config.kwargs["BLOCK_N"]
    chunks = triton.cdiv(n, block_n)
    _span_kernel[(chunks,)](
        batch.ids.rows, numbers, out, unique_rows, weights,
        momentum1 if momentum1 is not None else weights, momentum2 if momentum2 is not None else weights, span,
        n, batch.dim, weights.stride(0), chunks, **rule.args(), UPDATE=update, DETERMINISTIC=batch.deterministic,
        BLOCK_N=block_n, BLOCK_D=batch.block_d, BLOCK_K=min(SPAN_BLOCK_K, max(1, CHUNK_TILE // batch.block_d)),
        num_warps=4,
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
    block_n = PSW_BLOCK_N
    _psw_grad_kernel[(triton.cdiv(num_ids, block_n),)](
        grad_output, weights, rows, bag, offsets, out,
        num_ids, grad_output.shape[0], weights.shape[1], grad_output.stride(0), weights.stride(0),
        MEAN=pooling == "mean", BLOCK_N=block_n, BLOCK_D=_block_d(weights.shape[1]),
    )  # fmt: skip
    return out
