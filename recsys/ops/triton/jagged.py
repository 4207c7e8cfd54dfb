# mypy: disable-error-code="no-untyped-def"
# (Triton kernels take untyped pointer arguments; the host wrappers below are typed.)
"""Triton kernels of the jagged helpers: complete cumsum, jagged -> padded dense and back.

Dimension letters: B rows, L the padded length, D the width of each value, N values (all rows).
Layout: see `recsys.ops.reference.jagged`.

Kernels:
    complete cumsum       grid (1,): ONE program walks the lengths in chunks of CUMSUM_BLOCK, a
                          `tl.cumsum` per chunk plus the running total. Simple and exact, but sequential
                          over chunks: fine for batch-sized inputs (~1e5), slower than torch.cumsum beyond.
    jagged -> dense       grid (B, L-blocks, D-blocks): a (BLOCK_L, BLOCK_D) tile of row b, masked loads
                          (positions past the row's end read the padding value), masked stores (< L).
    dense -> jagged       grid (B, L-blocks, D-blocks) too: program (b, j) handles the row's positions
                          j*BLOCK_L, j*BLOCK_L + grid_L*BLOCK_L, ... up to the row's length, so rows longer
                          than L are covered (their positions >= L get 0) without the host knowing the
                          longest row (no device sync).

Pure copies: values keep their dtype (the padding value is rounded to it on the host), so results match
the reference bit for bit. Works with Triton 3.6 and 3.9 (only long-standing `tl` APIs). Under
`TRITON_INTERPRET=1` (set before `triton` is first imported) the kernels run on CPU in the interpreter,
with small blocks so that tests with tiny shapes still cover several blocks and the masks.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
CUMSUM_BLOCK = 16 if INTERPRETED else 1024
MAX_BLOCK_D = 16 if INTERPRETED else 128
TILE_ELEMENTS = 64 if INTERPRETED else 4096  # BLOCK_L * BLOCK_D of one program


@triton.jit
def _complete_cumsum_kernel(
    lengths_ptr,  # (n,) int32 / int64
    out_ptr,  # (n+1,) int64
    n,
    BLOCK: tl.constexpr,
):
    total = tl.zeros([1], dtype=tl.int64)  # running sum of the chunks before this one
    tl.store(out_ptr + tl.arange(0, 1), total)
    for start in range(0, n, BLOCK):
        i = start + tl.arange(0, BLOCK)
        mask = i < n
        x = tl.load(lengths_ptr + i, mask=mask, other=0).to(tl.int64)
        tl.store(out_ptr + 1 + i, tl.cumsum(x, axis=0) + total, mask=mask)
        total += tl.sum(x, axis=0)


@triton.jit
def _jagged_to_dense_kernel(
    values_ptr,  # (N, D), strides (stride_vn, stride_vd)
    offsets_ptr,  # (B+1,) int32 / int64
    pad_ptr,  # (1,) the padding value in the values' dtype
    out_ptr,  # (B, L, D) contiguous
    L,
    D,
    stride_vn,
    stride_vd,
    BLOCK_L: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    pos = tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)  # positions in the row
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    start = tl.load(offsets_ptr + b).to(tl.int64)
    length = tl.load(offsets_ptr + b + 1).to(tl.int64) - start
    out_mask = (pos < L)[:, None] & (d < D)[None, :]
    in_row = (pos < length)[:, None]
    x = tl.load(
        values_ptr + (start + pos)[:, None] * stride_vn + d[None, :] * stride_vd, mask=in_row & out_mask, other=0
    )
    x = tl.where(in_row, x, tl.load(pad_ptr))  # same dtype on both sides: no rounding
    out = out_ptr + b.to(tl.int64) * L * D + pos[:, None] * D + d[None, :]
    tl.store(out, x, mask=out_mask)


@triton.jit
def _dense_to_jagged_kernel(
    dense_ptr,  # (B, L, D), strides (stride_db, stride_dl, stride_dd)
    offsets_ptr,  # (B+1,) int32 / int64
    out_ptr,  # (N, D) contiguous
    L,
    D,
    stride_db,
    stride_dl,
    stride_dd,
    BLOCK_L: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = (d < D)[None, :]
    start = tl.load(offsets_ptr + b).to(tl.int64)
    length = (tl.load(offsets_ptr + b + 1).to(tl.int64) - start).to(tl.int32)
    row = dense_ptr + b.to(tl.int64) * stride_db
    # A grid-stride loop over the row's positions: also those >= L (rows longer than L), which get 0.
    for p0 in range(tl.program_id(1) * BLOCK_L, length, tl.num_programs(1) * BLOCK_L):
        pos = p0 + tl.arange(0, BLOCK_L)
        in_row = (pos < length)[:, None]
        x = tl.load(
            row + pos[:, None] * stride_dl + d[None, :] * stride_dd,
            mask=in_row & (pos < L)[:, None] & d_mask,
            other=0,
        )
        tl.store(out_ptr + (start + pos)[:, None] * D + d[None, :], x, mask=in_row & d_mask)


def _blocks(max_length: int, dim: int) -> tuple[int, int]:
    """(BLOCK_L, BLOCK_D): D-blocks up to MAX_BLOCK_D wide, as many positions as fill TILE_ELEMENTS."""
    block_d = min(triton.next_power_of_2(max(dim, 1)), MAX_BLOCK_D)
    block_l = min(max(TILE_ELEMENTS // block_d, 1), triton.next_power_of_2(max(max_length, 1)))
    return block_l, block_d


def complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    """(n+1,) int64 offsets of (n,) int32/int64 lengths (already validated)."""
    out = torch.empty(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    if lengths.numel() == 0:
        return out.zero_()
    _complete_cumsum_kernel[(1,)](lengths, out, lengths.numel(), BLOCK=CUMSUM_BLOCK)
    return out


def jagged_to_padded_dense(
    values: torch.Tensor, offsets: torch.Tensor, max_length: int, padding_value: float = 0.0
) -> torch.Tensor:
    """(B, L, D) in the values' dtype; arguments as in `recsys.ops.jagged.jagged_to_padded_dense` (validated)."""
    batch_size = offsets.numel() - 1
    dim = values.shape[1]
    out = torch.empty(batch_size, max_length, dim, dtype=values.dtype, device=values.device)
    if out.numel() == 0:
        return out
    if values.shape[0] == 0:  # no values (an empty buffer may have no address): all padding
        return out.fill_(padding_value)
    pad = torch.full((1,), padding_value, dtype=values.dtype, device=values.device)  # rounded like torch.full
    block_l, block_d = _blocks(max_length, dim)
    grid = (batch_size, triton.cdiv(max_length, block_l), triton.cdiv(dim, block_d))
    _jagged_to_dense_kernel[grid](
        values, offsets, pad, out, max_length, dim, values.stride(0), values.stride(1),
        BLOCK_L=block_l, BLOCK_D=block_d,
    )  # fmt: skip
    return out


def padded_dense_to_jagged(dense: torch.Tensor, offsets: torch.Tensor, *, total_length: int) -> torch.Tensor:
    """(N, D) in the dense dtype; arguments as in `recsys.ops.jagged.padded_dense_to_jagged` (validated)."""
    batch_size, max_length, dim = dense.shape
    out = torch.empty(total_length, dim, dtype=dense.dtype, device=dense.device)
    if out.numel() == 0:
        return out
    if max_length == 0:  # nothing to read (an empty buffer may have no address): all positions are >= L
        return out.zero_()
    block_l, block_d = _blocks(max_length, dim)
    grid = (batch_size, triton.cdiv(max_length, block_l), triton.cdiv(dim, block_d))
    _dense_to_jagged_kernel[grid](
        dense, offsets, out, max_length, dim, dense.stride(0), dense.stride(1), dense.stride(2),
        BLOCK_L=block_l, BLOCK_D=block_d,
    )  # fmt: skip
    return out
