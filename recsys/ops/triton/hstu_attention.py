# mypy: disable-error-code="no-untyped-def"
# (Triton kernels take untyped pointer arguments; the host launchers below are typed.)
"""Triton kernels of HSTU attention over jagged sequences: forward, and a backward in two kernels.

Dimension letters: S sequences, N tokens, H heads, E head dim, L the position-bias width (`max_len`), K time
buckets, P private copies of the bias gradients. Semantics: see `recsys.ops.reference.hstu_attention`.

Layout (S=3 sequences of lengths 2, 0, 3; `max_seq_len` bounds the lengths, here 3)::

    q, k, v   (N, H, E)   [t0 t1 | t2 t3 t4 | pad]   strided views (chunks of one (N, 4*H*E) linear output)
    offsets   (S+1,)      [0, 2, 2, 5]               tokens past offsets[-1] belong to no sequence: output 0

    one (sequence, head): the causal tile walk of a sequence of 5 tokens, blocks of 2
                keys ->  j0 j1 | j2 j3 | j4
        q-block 0       [ \\    |       |    ]     forward / dq: each query block loops over key blocks
        q-block 1       [ ##   | \\     |    ]     up to its diagonal (## full, \\ masked on the diagonal)
        q-block 2       [ ##   | ##    | \\  ]     dk/dv: each key block loops over the query blocks
                                                  from its diagonal down to the sequence's end

Grids (sequences on axis 0, which allows 2**31 - 1 programs; axes 1 and 2 allow 65,535), read in launch order
with the block fastest (`_sequence_and_block`: programs running together share one sequence's keys in L2):
    forward     (S, cdiv(max_seq_len, BLOCK_M), H): program (s, m, h) takes query blocks m, m + grid_1, ... of
                sequence s (one when `max_seq_len` is the longest length, none when its sequence is shorter, so
                the program exits), the last query blocks (the most work) launched first; per block it loops over
                key blocks up to the diagonal, recomputing nothing.
                s = q k^T + biases gathered from the (H, L) / (H, K) tables, causal mask and SiLU fused,
                acc += silu(s) / L @ v in fp32.
    dk / dv     (S, cdiv(max_seq_len, BLOCK_N), H): a key block loops over query blocks from its diagonal to the
                sequence's end, recomputing s; dv += a^T dO, dk += ds^T q.
    dq + biases (S, cdiv(max_seq_len, BLOCK_M), H): a query block loops over key blocks up to its diagonal;
                dq += ds k, and ds is added atomically into P private fp32 copies of the bias gradients
                (copy = program id mod P, so thousands of programs do not queue on the same few hundred
                addresses), summed on the host: the position bias's one add per diagonal of a tile (its
                scores summed along the diagonal first, `_diagonal_sums`), the time bias's one per score.

Kernel arguments: q, k, v (and the output gradient) are read through their strides; outputs are contiguous (N, H,
E), allocated unfilled and written whole (the last sequence's first programs zero the rows past offsets[-1],
`_zero_tail`: filling out, dq, dk and dv took 0.30 ms of fwd + bwd's 12.36 at 64 x 4096 on an H200); the tables are
contiguous; times are int64; tensors a kernel does not read without HAS_TIME are stand-ins. Programs index the
tables' rows by head, and the sequence's tokens from `offsets[s]`.

Determinism: the forward, dq, dk and dv are (one program owns each output row, a fixed loop order); the bias
gradients are not on a GPU (fp32 atomic adds in arrival order). Dot inputs are the tensors' dtype (bf16 under
autocast), accumulation fp32; fp32 dots run in IEEE fp32 (no TF32), like torch's default matmul. With bf16 / fp16
inputs on a GPU the sigmoid is PTX's tanh.approx (`_sigmoid`); fp32 inputs, and the interpreter, compute it exactly.

Only the tiles that cross the causal diagonal mask their scores (the `*_tile` helpers' DIAGONAL); configs are
autotuned per head dim, time buckets and class of the longest sequence (`length_class`).

Time buckets are computed in-kernel exactly as `time_buckets` does in float64: e = floor(log2(fp32(gap))) is
corrected by integer shifts (fp32 rounds 2**k - 1 up to 2**k above 2**24), so every int64 gap gets its bucket.

Works with Triton 3.6 and 3.9 (long-standing `tl` APIs, `tl.gather` of Triton 3.2 on, and the TMA configs'
`tl.make_tensor_descriptor` of 3.4 on). Under `TRITON_INTERPRET=1` (set before `triton` is first imported) the
kernels run on CPU in the interpreter with one small config (blocks of 16), so that tiny test shapes still cover
several blocks, the diagonal and the masks.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
BIAS_COPIES = 4 if INTERPRETED else 64  # P
MAX_GRID_BLOCKS = 65_535  # programs along grid axis 1 (CUDA's limit); past it a program takes several blocks
# The interpreter multiplies bf16 dot operands as their raw 16-bit integers (Triton 3.9): upcast them there.
_UPCAST_DOTS = tl.constexpr(INTERPRETED)


# The autotune set, (BLOCK_M, BLOCK_N, num_warps, num_stages): small blocks for short sequences (a 200-token
# sequence has 2 blocks of 128), 128-row blocks with deeper pipelines for long ones. A config a GPU's shared memory
# cannot hold (Triton's OutOfResources) is skipped by the autotuner there.
AUTOTUNE_TILES = (
    (32, 32, 4, 2),
    (32, 64, 4, 2),
    (64, 32, 4, 3),
    (64, 64, 4, 3),
    (128, 64, 8, 2),
    (64, 128, 8, 2),
    (128, 64, 4, 3),
    (128, 64, 8, 3),
    (128, 128, 8, 3),
)
TMA_MIN_BLOCK_M = 64  # a tensor-descriptor read pays its setup off over 64 query rows and more
TMA_TILES = tuple(tile for tile in AUTOTUNE_TILES if tile[0] >= TMA_MIN_BLOCK_M)  # tiles that also come with TMA on


def _configs(block_m: str, block_n: str) -> list[triton.Config]:
    """The autotune set (`AUTOTUNE_TILES`); `block_m`/`block_n` name the kernel's query and key block parameters."""
    if INTERPRETED:
        return [triton.Config({block_m: 16, block_n: 16}, num_warps=1)]
    return [
        triton.Config({block_m: bm, block_n: bn}, num_warps=warps, num_stages=stages)
        for bm, bn, warps, stages in AUTOTUNE_TILES
    ]


def _with(config: triton.Config, **params: Any) -> triton.Config:
    """`config` with more (or other) constexpr parameters."""
    return triton.Config({**config.kwargs, **params}, num_warps=config.num_warps, num_stages=config.num_stages)


def _with_tma(plain: list[triton.Config]) -> list[triton.Config]:
    """`plain` with TMA off, and on for the tiles of 64 query rows and more: a kernel may read the rows of its inner
    loop through tensor descriptors (the TMA unit computes the addresses and zero-fills past the tensor's end,
    instead of a register-held address and mask per element); pruned where the layout does not allow it
    (`_tma_or_not`)."""
    # the interpreter's tests pin their own
    tma = [c for c in plain if c.kwargs["BLOCK_M"] >= TMA_MIN_BLOCK_M and not INTERPRETED]
    return [_with(c, TMA=False) for c in plain] + [_with(c, TMA=True) for c in tma]


def _tma_or_not(configs: list[triton.Config], named_args: dict[str, Any], **kwargs: Any) -> list[triton.Config]:
    """The autotuner's early prune: TMA configs only where the call's layout allows tensor descriptors. The autotuner
    passes the call's positional arguments as `named_args` and its keyword arguments (TMA_OK among them) apart."""
    tma_ok = {**named_args, **kwargs}["TMA_OK"]
    return [c for c in configs if tma_ok or not c.kwargs.get("TMA", False)]


def config_tile(config: triton.Config) -> tuple[int, int, int, int]:
    """The `AUTOTUNE_TILES` entry of one of the autotuned kernels' configs."""
    return config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"], config.num_warps, config.num_stages


def _dq_configs() -> list[triton.Config]:
    """`_configs` with DIAGS, the power of two that holds a tile's BLOCK_M + BLOCK_N - 1 diagonals, and TMA."""
    return _with_tma(
        [
            _with(c, DIAGS=triton.next_power_of_2(c.kwargs["BLOCK_M"] + c.kwargs["BLOCK_N"] - 1))
            for c in _configs("BLOCK_M", "BLOCK_N")
        ]
    )


# autotuned per head dim, time buckets and class of the longest sequence: short sequences want small blocks (more
# programs), long ones large blocks (fewer re-reads); one config for every length would serve one of them
AUTOTUNE_KEY = ["HEAD_DIM", "HAS_TIME", "length_class"]
# Integer arguments Triton must not compile variants for (it would for a value of 1 and for multiples of 16):
# length_class is read by the autotuner alone; num_tokens changes with every batch
NOT_SPECIALIZED = ["length_class", "num_tokens"]
# each kernel's autotune: per AUTOTUNE_KEY and whether the call's layout takes tensor descriptors, TMA configs
# pruned where it does not
TUNED_WITH_TMA = {"key": [*AUTOTUNE_KEY, "TMA_OK"], "prune_configs_by": {"early_config_prune": _tma_or_not}}


def length_class(max_seq_len: int) -> int:
    """0 up to 256 tokens, 1 up to 1,024, 2 beyond: the sequence lengths one autotuned config serves."""
    return 0 if max_seq_len <= 256 else 1 if max_seq_len <= 1024 else 2


@triton.jit
def _time_bucket(gap, num_buckets):
    """Bucket of int64 gaps: 0 below 1 s, else floor(log2(gap)) + 1, at most num_buckets - 1."""
    g = tl.maximum(gap, 1)
    e = tl.floor(tl.log2(g.to(tl.float32))).to(tl.int64)
    e = tl.minimum(tl.maximum(e, 0), 62)
    e = tl.where((g >> e) == 0, e - 1, e)  # fp32 rounded g up to the next power of two
    e = tl.where((g >> (e + 1)) > 0, e + 1, e)  # an approximate log2 came out low
    return tl.minimum(tl.where(gap >= 1, e + 1, 0), num_buckets - 1)


@triton.jit
def _bias_index(distance, max_len):
    """Column of the position-bias table of a query - key distance (clamped into [0, L - 1])."""
    return tl.minimum(tl.maximum(distance, 0), max_len - 1)


@triton.jit
def _bias(distance, gap, pos_bias_ptr, time_bias_ptr, max_len, num_buckets, HAS_TIME: tl.constexpr):
    """fp32 bias tile gathered from one head's rows of the (tiny, cache-resident) tables."""
    bias = tl.load(pos_bias_ptr + _bias_index(distance, max_len)).to(tl.float32)
    if HAS_TIME:
        bias += tl.load(time_bias_ptr + _time_bucket(gap, num_buckets)).to(tl.float32)
    return bias


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr):
    """a @ b in fp32; in the interpreter the operands (already rounded to their dtype) are upcast first."""
    if _UPCAST_DOTS:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _sigmoid(x, FAST: tl.constexpr):
    """sigmoid(x) in fp32. FAST (bf16 / fp16 inputs on a GPU): 0.5 tanh(x / 2) + 0.5 with PTX's tanh.approx.f32, one
    special-function op (relative error <= 2^-10.7, below bf16's rounding) where exp and an IEEE division take one
    and a dozen more instructions: SiLU attention does this for every score, beside two dots of head-dim depth."""
    if FAST:
        t = tl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=f,f", [x * 0.5], dtype=tl.float32, is_pure=True, pack=1
        )
        return 0.5 * t + 0.5
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _load_rows(ptr, rows, row_mask, stride_n, stride_e, HEAD_DIM: tl.constexpr, BLOCK_E: tl.constexpr):
    """(len(rows), BLOCK_E) tile of one head's vectors; columns past E and masked rows read 0."""
    e = tl.arange(0, BLOCK_E)
    mask = row_mask[:, None] & (e < HEAD_DIM)[None, :]
    return tl.load(ptr + rows[:, None] * stride_n + e[None, :] * stride_e, mask=mask, other=0.0)


@triton.jit
def _head_rows(ptr, rows_left, stride_n, HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_E: tl.constexpr):
    """A tensor descriptor of one head's `rows_left` rows from `ptr` on: blocks of (BLOCK_ROWS, BLOCK_E), zero past
    the rows and past E."""
    return tl.make_tensor_descriptor(
        ptr, shape=[rows_left, HEAD_DIM], strides=[stride_n, 1], block_shape=[BLOCK_ROWS, BLOCK_E]
    )


@triton.jit
def _rows_from(ptr, rows_left, stride_n, HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_E: tl.constexpr,
               TMA: tl.constexpr):  # fmt: skip
    """What a kernel reads one head's rows through: with TMA their descriptor (`_head_rows`), else `ptr` itself, a
    stand-in the kernel never reads as one (it loads through `_load_rows`)."""
    if TMA:
        return _head_rows(ptr, rows_left, stride_n, HEAD_DIM, BLOCK_ROWS, BLOCK_E)
    else:
        return ptr


@triton.jit
def _store_rows(ptr, tile, rows, row_mask, row_stride, HEAD_DIM: tl.constexpr, BLOCK_E: tl.constexpr):
    """Store a fp32 tile into one head's rows of a contiguous (N, H, E) output, in the output's dtype."""
    e = tl.arange(0, BLOCK_E)
    mask = row_mask[:, None] & (e < HEAD_DIM)[None, :]
    tl.store(ptr + rows[:, None] * row_stride + e[None, :], tile.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sequence_and_block(HEAVIEST_LAST: tl.constexpr):
    """(sequence, first block, blocks per program step) of this program of an (S, blocks, H) grid. The GPU starts
    programs axis 0 first, so axes 0 and 1 are read as one index whose block part varies fastest: the programs
    running together take the blocks of one sequence and share its keys and values in L2 (FlashAttention's launch
    order), rather than one block of many sequences. HEAVIEST_LAST (a query block's work grows with its position):
    the blocks are taken in reverse, the longest programs first, so that no long one starts last."""
    blocks = tl.num_programs(1)
    linear = tl.program_id(0).to(tl.int64) + tl.program_id(1).to(tl.int64) * tl.num_programs(0)
    seq = (linear // blocks).to(tl.int32)
    block = (linear % blocks).to(tl.int32)
    if HEAVIEST_LAST:
        block = blocks - 1 - block
    return seq, block, blocks


@triton.jit
def _zero_tail(ptr, seq, block, length, rows_left, row_stride, HEAD_DIM: tl.constexpr, BLOCK_E: tl.constexpr,
               BLOCK_ROWS: tl.constexpr):  # fmt: skip
    """Zeroes one head's rows past the last sequence's end (rows `length` to `rows_left` from its start: the tokens
    past offsets[-1]), in the last sequence's first program of that head: every output row is written by a kernel,
    so the host allocates outputs without filling them."""
    if (seq == tl.num_programs(0) - 1) & (block == 0):
        zeros = tl.zeros([BLOCK_ROWS, BLOCK_E], dtype=tl.float32)
        end = rows_left.to(tl.int32)  # the loop's bounds of one type (`length` is int32)
        for r0 in range(length, end, BLOCK_ROWS):
            rows = r0 + tl.arange(0, BLOCK_ROWS)
            _store_rows(ptr, zeros, rows, rows < end, row_stride, HEAD_DIM, BLOCK_E)


@triton.jit
def _times(ptr, rows, row_mask, HAS_TIME: tl.constexpr):
    """(len(rows),) int64 times of the rows, or the row numbers as a stand-in without time buckets."""
    times = rows.to(tl.int64)
    if HAS_TIME:
        times = tl.load(ptr + rows, mask=row_mask, other=0)
    return times


@triton.jit
def _forward_tile(
    acc, q, qt, m, n0, length,
    k_ptr, v_ptr, k_rows, v_rows, ts_ptr, pos_bias_ptr, time_bias_ptr,
    stride_kn, stride_ke, stride_vn, stride_ve,
    max_len, num_buckets, scale,
    HEAD_DIM: tl.constexpr, BLOCK_E: tl.constexpr, HAS_TIME: tl.constexpr, PRECISION: tl.constexpr,
    FAST: tl.constexpr, BLOCK_N: tl.constexpr, DIAGONAL: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """acc + silu(q k^T + bias) / L @ v over the key block at n0 (queries at rows m). Only a DIAGONAL block (one that
    reaches the query block's first row) masks its later keys: a block wholly before it has none. Keys past the
    sequence's end are later than every real query, and a query row past it is never stored. TMA: k and v through
    their descriptors `k_rows` / `v_rows`, whose rows past the sequence's end are the next sequence's (finite, and
    masked here like any later key)."""
    n = n0 + tl.arange(0, BLOCK_N)
    n_mask = n < length
    if TMA:
        k = k_rows.load([n0, 0])  # (BLOCK_N, E)
        v = v_rows.load([n0, 0])
    else:
        k = _load_rows(k_ptr, n, n_mask, stride_kn, stride_ke, HEAD_DIM, BLOCK_E)
        v = _load_rows(v_ptr, n, n_mask, stride_vn, stride_ve, HEAD_DIM, BLOCK_E)
    distance = m[:, None] - n[None, :]  # (BLOCK_M, BLOCK_N)
    gap = qt[:, None] - _times(ts_ptr, n, n_mask, HAS_TIME)[None, :]
    s = _dot(q, tl.trans(k), PRECISION)
    s += _bias(distance, gap, pos_bias_ptr, time_bias_ptr, max_len, num_buckets, HAS_TIME)
    a = s * _sigmoid(s, FAST) * scale
    if DIAGONAL:
        a = tl.where(distance >= 0, a, 0.0)
    return acc + _dot(a.to(v.dtype), v, PRECISION)


@triton.autotune(configs=_with_tma(_configs("BLOCK_M", "BLOCK_N")), **TUNED_WITH_TMA)
@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def _forward_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr,  # out: (N, H, E) contiguous
    offsets_ptr, pos_bias_ptr, time_bias_ptr, ts_ptr, qt_ptr,
    stride_qn, stride_qh, stride_qe, stride_kn, stride_kh, stride_ke, stride_vn, stride_vh, stride_ve,
    max_len, num_buckets, scale, length_class, num_tokens,
    HEAD_DIM: tl.constexpr, BLOCK_E: tl.constexpr, HAS_TIME: tl.constexpr, PRECISION: tl.constexpr,
    FAST: tl.constexpr, TMA_OK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    seq, block, blocks = _sequence_and_block(HEAVIEST_LAST=True)
    h, num_heads = tl.program_id(2), tl.num_programs(2)
    start = tl.load(offsets_ptr + seq)
    length = (tl.load(offsets_ptr + seq + 1) - start).to(tl.int32)
    q_ptr += start * stride_qn + h * stride_qh
    k_ptr += start * stride_kn + h * stride_kh
    v_ptr += start * stride_vn + h * stride_vh
    out_ptr += (start * num_heads + h) * HEAD_DIM
    pos_bias_ptr += h * max_len
    time_bias_ptr += h * num_buckets
    q_rows = _rows_from(q_ptr, num_tokens - start, stride_qn, HEAD_DIM, BLOCK_M, BLOCK_E, TMA)
    k_rows = _rows_from(k_ptr, num_tokens - start, stride_kn, HEAD_DIM, BLOCK_N, BLOCK_E, TMA)
    v_rows = _rows_from(v_ptr, num_tokens - start, stride_vn, HEAD_DIM, BLOCK_N, BLOCK_E, TMA)
    for m0 in range(block * BLOCK_M, length, blocks * BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)  # query positions in the sequence
        m_mask = m < length
        q = q_rows.load([m0, 0]) if TMA else _load_rows(q_ptr, m, m_mask, stride_qn, stride_qe, HEAD_DIM, BLOCK_E)
        qt = _times(qt_ptr + start, m, m_mask, HAS_TIME)
        acc = tl.zeros([BLOCK_M, BLOCK_E], dtype=tl.float32)
        before = m0 // BLOCK_N * BLOCK_N  # key blocks that end before the query block begins: no mask
        end = tl.minimum(m0 + BLOCK_M, length)
        for diagonal in tl.static_range(2):  # [0, before) unmasked, then [before, end) up to the diagonal
            for n0 in range(before * diagonal, before + diagonal * (end - before), BLOCK_N):
                acc = _forward_tile(
                    acc, q, qt, m, n0, length, k_ptr, v_ptr, k_rows, v_rows, ts_ptr + start, pos_bias_ptr,
                    time_bias_ptr, stride_kn, stride_ke, stride_vn, stride_ve, max_len, num_buckets, scale,
                    HEAD_DIM, BLOCK_E, HAS_TIME, PRECISION, FAST, BLOCK_N, DIAGONAL=diagonal, TMA=TMA,
                )  # fmt: skip
        _store_rows(out_ptr, acc, m, m_mask, num_heads * HEAD_DIM, HEAD_DIM, BLOCK_E)
    _zero_tail(out_ptr, seq, block, length, num_tokens - start, num_heads * HEAD_DIM, HEAD_DIM, BLOCK_E, BLOCK_M)


@triton.jit
def _dkdv_tile(
    dk, dv, k, v, ts, n, m0, length,
    q_ptr, do_ptr, q_rows, do_rows, qt_ptr, pos_bias_ptr, time_bias_ptr,
    stride_qn, stride_qe, stride_don, stride_doe,
    max_len, num_buckets, scale,
    HEAD_DIM: tl.constexpr, BLOCK_E: tl.constexpr, HAS_TIME: tl.constexpr, PRECISION: tl.constexpr,
    FAST: tl.constexpr, BLOCK_M: tl.constexpr, DIAGONAL: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """(dk, dv) of the key rows n plus the query block at m0's part (tiles transposed: keys x queries). Only a
    DIAGONAL block (one whose first query precedes the last key) masks; query rows past the end have dO = 0 and add
    nothing. TMA: q and dO through their descriptors `q_rows` / `do_rows`, whose rows past the sequence's end are the
    next sequence's: dO's are zeroed here (q's then meet zero scores' gradients)."""
    m = m0 + tl.arange(0, BLOCK_M)
    m_mask = m < length
    if TMA:
        q = q_rows.load([m0, 0])  # (BLOCK_M, E)
        do = do_rows.load([m0, 0])
        do = tl.where(m_mask[:, None], do, tl.zeros_like(do))
    else:
        q = _load_rows(q_ptr, m, m_mask, stride_qn, stride_qe, HEAD_DIM, BLOCK_E)  # (BLOCK_M, E)
        do = _load_rows(do_ptr, m, m_mask, stride_don, stride_doe, HEAD_DIM, BLOCK_E)
    distance = m[None, :] - n[:, None]  # (BLOCK_N, BLOCK_M)
    gap = _times(qt_ptr, m, m_mask, HAS_TIME)[None, :] - ts[:, None]
    s_t = _dot(k, tl.trans(q), PRECISION)
    s_t += _bias(distance, gap, pos_bias_ptr, time_bias_ptr, max_len, num_buckets, HAS_TIME)
    sig = _sigmoid(s_t, FAST)
    a_t = s_t * sig * scale
    da_t = _dot(v, tl.trans(do), PRECISION)
    ds_t = da_t * scale * sig * (1.0 + s_t * (1.0 - sig))  # silu' = sig (1 + s (1 - sig))
    if DIAGONAL:
        a_t = tl.where(distance >= 0, a_t, 0.0)
        ds_t = tl.where(distance >= 0, ds_t, 0.0)
    dv += _dot(a_t.to(do.dtype), do, PRECISION)
    dk += _dot(ds_t.to(q.dtype), q, PRECISION)
    return dk, dv


@triton.autotune(configs=_with_tma(_configs("BLOCK_M", "BLOCK_N")), **TUNED_WITH_TMA)
@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def _dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr,  # do: (N, H, E) output gradient, any strides
    dk_ptr, dv_ptr,  # (N, H, E) contiguous
    offsets_ptr, pos_bias_ptr, time_bias_ptr, ts_ptr, qt_ptr,
    stride_qn, stride_qh, stride_qe, stride_kn, stride_kh, stride_ke, stride_vn, stride_vh, stride_ve,
    stride_don, stride_doh, stride_doe,
    max_len, num_buckets, scale, length_class, num_tokens,
    HEAD_DIM: tl.constexpr, BLOCK_E: tl.constexpr, HAS_TIME: tl.constexpr, PRECISION: tl.constexpr,
    FAST: tl.constexpr, TMA_OK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    seq, block, blocks = _sequence_and_block(HEAVIEST_LAST=False)  # a key block's work shrinks with its position
    h, num_heads = tl.program_id(2), tl.num_programs(2)
    start = tl.load(offsets_ptr + seq)
    length = (tl.load(offsets_ptr + seq + 1) - start).to(tl.int32)
    q_ptr += start * stride_qn + h * stride_qh
    k_ptr += start * stride_kn + h * stride_kh
    v_ptr += start * stride_vn + h * stride_vh
    do_ptr += start * stride_don + h * stride_doh
    dk_ptr += (start * num_heads + h) * HEAD_DIM
    dv_ptr += (start * num_heads + h) * HEAD_DIM
    pos_bias_ptr += h * max_len
    time_bias_ptr += h * num_buckets
    q_rows = _rows_from(q_ptr, num_tokens - start, stride_qn, HEAD_DIM, BLOCK_M, BLOCK_E, TMA)
    do_rows = _rows_from(do_ptr, num_tokens - start, stride_don, HEAD_DIM, BLOCK_M, BLOCK_E, TMA)
    for n0 in range(block * BLOCK_N, length, blocks * BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)  # key positions in the sequence
        n_mask = n < length
        k = _load_rows(k_ptr, n, n_mask, stride_kn, stride_ke, HEAD_DIM, BLOCK_E)  # (BLOCK_N, E)
        v = _load_rows(v_ptr, n, n_mask, stride_vn, stride_ve, HEAD_DIM, BLOCK_E)
        ts = _times(ts_ptr + start, n, n_mask, HAS_TIME)
        dk = tl.zeros([BLOCK_N, BLOCK_E], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_E], dtype=tl.float32)
        first = n0 // BLOCK_M * BLOCK_M  # the query block holding the diagonal
        after = tl.minimum(tl.cdiv(n0 + BLOCK_N - 1, BLOCK_M) * BLOCK_M, length)  # blocks from the last key on
        for later in tl.static_range(2):  # [first, after) masked on the diagonal, then [after, length) unmasked
            for m0 in range(first + later * (after - first), after + later * (length - after), BLOCK_M):
                dk, dv = _dkdv_tile(
                    dk, dv, k, v, ts, n, m0, length, q_ptr, do_ptr, q_rows, do_rows, qt_ptr + start, pos_bias_ptr,
                    time_bias_ptr, stride_qn, stride_qe, stride_don, stride_doe, max_len, num_buckets, scale,
                    HEAD_DIM, BLOCK_E, HAS_TIME, PRECISION, FAST, BLOCK_M, DIAGONAL=1 - later, TMA=TMA,
                )  # fmt: skip
        _store_rows(dk_ptr, dk, n, n_mask, num_heads * HEAD_DIM, HEAD_DIM, BLOCK_E)
        _store_rows(dv_ptr, dv, n, n_mask, num_heads * HEAD_DIM, HEAD_DIM, BLOCK_E)
    _zero_tail(dk_ptr, seq, block, length, num_tokens - start, num_heads * HEAD_DIM, HEAD_DIM, BLOCK_E, BLOCK_N)
    _zero_tail(dv_ptr, seq, block, length, num_tokens - start, num_heads * HEAD_DIM, HEAD_DIM, BLOCK_E, BLOCK_N)


@triton.jit
def _diagonal_sums(ds, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DIAGS: tl.constexpr):
    """(DIAGS,) sums of a (BLOCK_M, BLOCK_N) tile along its diagonals: entry t sums the elements (i, j) with
    i - j = t - (BLOCK_N - 1), zero past the tile's BLOCK_M + BLOCK_N - 1 diagonals. Each row is gathered into the
    columns of its diagonals (a skew), then the rows are summed: a position bias's gradient is one sum a diagonal,
    so a tile sends BLOCK_M + BLOCK_N - 1 atomic adds instead of one per score."""
    i = tl.arange(0, BLOCK_M)[:, None]
    t = tl.arange(0, DIAGS)[None, :]
    j = i + (BLOCK_N - 1) - t  # (BLOCK_M, DIAGS): the column of row i on diagonal t
    inside = (j >= 0) & (j < BLOCK_N)
    skewed = tl.gather(ds, tl.minimum(tl.maximum(j, 0), BLOCK_N - 1), axis=1)
    return tl.sum(tl.where(inside, skewed, 0.0), axis=0)


@triton.jit
def _dq_tile(
    dq, q, do, qt, m, m_mask, m0, n0, length,
    k_ptr, v_ptr, k_rows, v_rows, ts_ptr, pos_bias_ptr, time_bias_ptr, dpos_ptr, dtime_ptr,
    stride_kn, stride_ke, stride_vn, stride_ve,
    max_len, num_buckets, scale,
    HEAD_DIM: tl.constexpr, BLOCK_E: tl.constexpr, HAS_TIME: tl.constexpr, PRECISION: tl.constexpr,
    FAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DIAGS: tl.constexpr, DIAGONAL: tl.constexpr,
    TMA: tl.constexpr,
):  # fmt: skip
    """dq of the query rows m (from m0) plus the key block at n0's part; ds added into the bias gradients' private
    copy (the position bias's by the tile's diagonals). A block before the DIAGONAL needs no causal mask; query rows
    past the end (dO = 0) add nothing. TMA: k and v through their descriptors `k_rows` / `v_rows`, whose rows past the
    sequence's end are the next sequence's: later than every real query, so masked like any later key."""
    n = n0 + tl.arange(0, BLOCK_N)
    n_mask = n < length
    if TMA:
        k = k_rows.load([n0, 0])  # (BLOCK_N, E)
        v = v_rows.load([n0, 0])
    else:
        k = _load_rows(k_ptr, n, n_mask, stride_kn, stride_ke, HEAD_DIM, BLOCK_E)  # (BLOCK_N, E)
        v = _load_rows(v_ptr, n, n_mask, stride_vn, stride_ve, HEAD_DIM, BLOCK_E)
    distance = m[:, None] - n[None, :]  # (BLOCK_M, BLOCK_N)
    gap = qt[:, None] - _times(ts_ptr, n, n_mask, HAS_TIME)[None, :]
    s = _dot(q, tl.trans(k), PRECISION)
    s += _bias(distance, gap, pos_bias_ptr, time_bias_ptr, max_len, num_buckets, HAS_TIME)
    sig = _sigmoid(s, FAST)
    da = _dot(do, tl.trans(v), PRECISION)
    ds = da * scale * sig * (1.0 + s * (1.0 - sig))
    if DIAGONAL:
        ds = tl.where(distance >= 0, ds, 0.0)
    diagonal = tl.arange(0, DIAGS)
    diagonal_distance = m0 - n0 - (BLOCK_N - 1) + diagonal  # of the tile's diagonals, from its top-right corner
    tl.atomic_add(
        dpos_ptr + _bias_index(diagonal_distance, max_len),
        _diagonal_sums(ds, BLOCK_M, BLOCK_N, DIAGS),
        mask=(diagonal < BLOCK_M + BLOCK_N - 1) & (diagonal_distance >= 0),
        sem="relaxed",
    )
    if HAS_TIME:  # time buckets follow no diagonal: one add a score
        sent = m_mask[:, None] & (distance >= 0)
        tl.atomic_add(dtime_ptr + _time_bucket(gap, num_buckets), ds, mask=sent, sem="relaxed")
    return dq + _dot(ds.to(k.dtype), k, PRECISION)


@triton.autotune(configs=_dq_configs(), reset_to_zero=["dpos_ptr", "dtime_ptr"], **TUNED_WITH_TMA)
@triton.jit(do_not_specialize=NOT_SPECIALIZED)
def _dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr,
    dq_ptr,  # (N, H, E) contiguous
    dpos_ptr,  # (P, H, L) fp32 private copies of the position-bias gradient, zeroed
    dtime_ptr,  # (P, H, K) fp32 private copies of the time-bias gradient, zeroed (unused without HAS_TIME)
    offsets_ptr, pos_bias_ptr, time_bias_ptr, ts_ptr, qt_ptr,
    stride_qn, stride_qh, stride_qe, stride_kn, stride_kh, stride_ke, stride_vn, stride_vh, stride_ve,
    stride_don, stride_doh, stride_doe,
    max_len, num_buckets, scale, length_class, num_tokens,
    HEAD_DIM: tl.constexpr, BLOCK_E: tl.constexpr, HAS_TIME: tl.constexpr, PRECISION: tl.constexpr,
    FAST: tl.constexpr, COPIES: tl.constexpr, TMA_OK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DIAGS: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    seq, block, blocks = _sequence_and_block(HEAVIEST_LAST=True)
    h, num_heads = tl.program_id(2), tl.num_programs(2)
    start = tl.load(offsets_ptr + seq)
    length = (tl.load(offsets_ptr + seq + 1) - start).to(tl.int32)
    q_ptr += start * stride_qn + h * stride_qh
    k_ptr += start * stride_kn + h * stride_kh
    v_ptr += start * stride_vn + h * stride_vh
    do_ptr += start * stride_don + h * stride_doh
    dq_ptr += (start * num_heads + h) * HEAD_DIM
    copy = (seq * blocks + block) % COPIES
    dpos_ptr += (copy * num_heads + h) * max_len
    dtime_ptr += (copy * num_heads + h) * num_buckets
    pos_bias_ptr += h * max_len
    time_bias_ptr += h * num_buckets
    k_rows = _rows_from(k_ptr, num_tokens - start, stride_kn, HEAD_DIM, BLOCK_N, BLOCK_E, TMA)
    v_rows = _rows_from(v_ptr, num_tokens - start, stride_vn, HEAD_DIM, BLOCK_N, BLOCK_E, TMA)
    for m0 in range(block * BLOCK_M, length, blocks * BLOCK_M):
        m = m0 + tl.arange(0, BLOCK_M)
        m_mask = m < length
        q = _load_rows(q_ptr, m, m_mask, stride_qn, stride_qe, HEAD_DIM, BLOCK_E)  # (BLOCK_M, E)
        do = _load_rows(do_ptr, m, m_mask, stride_don, stride_doe, HEAD_DIM, BLOCK_E)
        qt = _times(qt_ptr + start, m, m_mask, HAS_TIME)
        dq = tl.zeros([BLOCK_M, BLOCK_E], dtype=tl.float32)
        before = m0 // BLOCK_N * BLOCK_N  # key blocks that end before the query block begins: no mask
        end = tl.minimum(m0 + BLOCK_M, length)
        for diagonal in tl.static_range(2):  # [0, before) unmasked, then [before, end) up to the diagonal
            for n0 in range(before * diagonal, before + diagonal * (end - before), BLOCK_N):
                dq = _dq_tile(
                    dq, q, do, qt, m, m_mask, m0, n0, length, k_ptr, v_ptr, k_rows, v_rows, ts_ptr + start,
                    pos_bias_ptr, time_bias_ptr, dpos_ptr, dtime_ptr, stride_kn, stride_ke, stride_vn, stride_ve,
                    max_len, num_buckets, scale, HEAD_DIM, BLOCK_E, HAS_TIME, PRECISION, FAST, BLOCK_M, BLOCK_N,
                    DIAGS, DIAGONAL=diagonal, TMA=TMA,
                )  # fmt: skip
        _store_rows(dq_ptr, dq, m, m_mask, num_heads * HEAD_DIM, HEAD_DIM, BLOCK_E)
    _zero_tail(dq_ptr, seq, block, length, num_tokens - start, num_heads * HEAD_DIM, HEAD_DIM, BLOCK_E, BLOCK_M)


# ------------------------------------------------------------------------------------------- host launchers


# every autotuned kernel of the op (the tests pin and vary their configs)
AUTOTUNED_KERNELS = (_forward_kernel, _dkdv_kernel, _dq_kernel)


def _block_e(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))  # tl.dot needs every dim >= 16


def _grid(num_seqs: int, max_seq_len: int, num_heads: int, block: str) -> Callable[[dict[str, Any]], tuple[int, ...]]:
    return lambda meta: (num_seqs, min(triton.cdiv(max_seq_len, meta[block]), MAX_GRID_BLOCKS), num_heads)


def _common_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    position_bias: torch.Tensor,
    time_bias: torch.Tensor | None,
    timestamps: torch.Tensor | None,
    query_times: torch.Tensor | None,
) -> tuple[Any, ...]:
    """The tables, times and q/k/v strides every kernel takes after its own tensors (unused ones: placeholders)."""
    return (
        offsets, position_bias, position_bias if time_bias is None else time_bias,
        offsets if timestamps is None else timestamps, offsets if query_times is None else query_times,
        *q.stride(), *k.stride(), *v.stride(),
    )  # fmt: skip


def _scalars(max_len: int, time_bias: torch.Tensor | None, max_seq_len: int) -> tuple[int, int, float, int]:
    """(L, K, 1 / L, the lengths' autotune class) as the kernels take them (K = 1 without time buckets: never
    read)."""
    return max_len, 1 if time_bias is None else time_bias.shape[1], 1.0 / max_len, length_class(max_seq_len)


def _constants(q: torch.Tensor, time_bias: torch.Tensor | None) -> dict[str, Any]:
    return {
        "HEAD_DIM": q.shape[2],
        "BLOCK_E": _block_e(q.shape[2]),
        "HAS_TIME": time_bias is not None,
        # fp32 dots in IEEE fp32, as torch's default matmul (no TF32); bf16 ignores it (tf32 is Triton's default)
        "PRECISION": "ieee" if q.dtype == torch.float32 else "tf32",
        # the special-function sigmoid where the inputs are rounded coarser than its error (not in the interpreter,
        # which runs no PTX)
        "FAST": q.dtype != torch.float32 and not INTERPRETED,
    }


TMA_ALIGN = 16  # bytes: a tensor descriptor's base address and row stride are multiples of it


def _tma_fits(*tensors: torch.Tensor) -> bool:
    """Whether a kernel may read these (N, H, E) views through tensor descriptors: a GPU with a TMA unit (Hopper on;
    the interpreter emulates it), rows of E contiguous elements, distinct rows (no stride 0, as a broadcast gradient
    has), and every head's rows starting on `TMA_ALIGN` bytes."""
    if not INTERPRETED and not (tensors[0].is_cuda and _capability(tensors[0].device) >= (9, 0)):
        return False
    return all(
        t.stride(2) == 1
        and t.stride(0) > 0
        and (t.data_ptr() | t.stride(0) * t.element_size() | t.stride(1) * t.element_size()) % TMA_ALIGN == 0
        for t in tensors
    )


def _tma_allowed(*tensors: torch.Tensor) -> bool:
    """`_tma_fits`, and where it does, Triton's allocator set for the descriptors' scratch: device-side descriptors
    take it from there, and Triton keeps the allocator in a context variable (one per thread, copied into each
    asyncio task and to_thread call), hence set on every call, where the kernel runs."""
    fits = _tma_fits(*tensors)
    if fits and not INTERPRETED:
        triton.set_allocator(_scratch_on(tensors[0].device))
    return fits


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


@functools.cache
def _scratch_on(device: torch.device) -> Callable[[int, int, int | None], torch.Tensor]:
    """Triton's allocator for the scratch of descriptors made in a kernel: bytes from torch's caching allocator."""
    return lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device)


def forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    *,
    max_len: int,
    position_bias: torch.Tensor,
    time_bias: torch.Tensor | None,
    timestamps: torch.Tensor | None,
    query_times: torch.Tensor | None,
    max_seq_len: int,
) -> torch.Tensor:
    """(N, H, E) in the inputs' dtype; arguments as in `recsys.ops.hstu_attention.hstu_attention` (validated;
    tables contiguous)."""
    num_tokens, num_heads, _ = q.shape
    num_seqs = offsets.numel() - 1
    if num_tokens == 0 or num_seqs == 0 or max_seq_len == 0:
        return torch.zeros(q.shape, dtype=q.dtype, device=q.device)  # no sequence: every token's output is 0
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # every row written (`_zero_tail`): no fill pass
    tma_ok = _tma_allowed(q, k, v)
    _forward_kernel[_grid(num_seqs, max_seq_len, num_heads, "BLOCK_M")](
        q, k, v, out, *_common_args(q, k, v, offsets, position_bias, time_bias, timestamps, query_times),
        *_scalars(max_len, time_bias, max_seq_len), num_tokens, **_constants(q, time_bias), TMA_OK=tma_ok,
    )  # fmt: skip
    return out


def backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    *,
    max_len: int,
    position_bias: torch.Tensor,
    time_bias: torch.Tensor | None,
    timestamps: torch.Tensor | None,
    query_times: torch.Tensor | None,
    max_seq_len: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Gradients (dq, dk, dv (N, H, E) in the inputs' dtype, d position_bias (H, L), d time_bias (H, K) or None,
    in the tables' dtypes) from `grad_out` (N, H, E), any strides."""
    num_tokens, num_heads, _ = q.shape
    num_seqs = offsets.numel() - 1
    launched = num_tokens > 0 and num_seqs > 0 and max_seq_len > 0
    # the kernels write every row (`_zero_tail`): no fill pass unless none runs
    dq, dk, dv = ((torch.empty if launched else torch.zeros)(q.shape, dtype=q.dtype, device=q.device) for _ in range(3))
    dpos = torch.zeros(BIAS_COPIES, *position_bias.shape, dtype=torch.float32, device=q.device)  # (P, H, L)
    # (P, H, K); without time buckets a one-element stand-in of its own (autotune zeroes it between trial runs)
    time_shape = (1,) if time_bias is None else (BIAS_COPIES, *time_bias.shape)
    dtime = torch.zeros(time_shape, dtype=torch.float32, device=q.device)
    if launched:
        common = _common_args(q, k, v, offsets, position_bias, time_bias, timestamps, query_times)
        scalars = (*grad_out.stride(), *_scalars(max_len, time_bias, max_seq_len), num_tokens)
        constants = {**_constants(q, time_bias), "TMA_OK": _tma_allowed(q, k, v, grad_out)}
        _dkdv_kernel[_grid(num_seqs, max_seq_len, num_heads, "BLOCK_N")](
            q, k, v, grad_out, dk, dv, *common, *scalars, **constants
        )
        _dq_kernel[_grid(num_seqs, max_seq_len, num_heads, "BLOCK_M")](
            q, k, v, grad_out, dq, dpos, dtime, *common, *scalars, **constants, COPIES=BIAS_COPIES
        )
    dtime_sum = None if time_bias is None else dtime.sum(0).to(time_bias.dtype)
    return dq, dk, dv, dpos.sum(0).to(position_bias.dtype), dtime_sum
