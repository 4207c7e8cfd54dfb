"""HSTU attention over jagged sequences (Zhai et al., ICML 2024): pointwise SiLU attention with relative biases.

Dimension letters: S sequences, N tokens (all sequences), H heads, E head dim, L the position-bias width
(`max_len`), K time buckets, M the longest sequence (`max_seq_len`).

Layout (S=3 sequences of lengths 2, 0, 3, and one token past the last sequence)::

    q, k, v     (N, H, E)   [t0 t1 | t2 t3 t4 | t5]     any strides: chunks of one (N, 4*H*E) linear output
    offsets     (S+1,)      [0, 2, 2, 5]                sequence s = tokens offsets[s]:offsets[s+1]
    output      (N, H, E)   [o0 o1 | o2 o3 o4 | 0]      tokens past offsets[-1] belong to no sequence: 0

Per head h, for query i and key j of the same sequence (positions i, j counted inside it):

    s_ij  = q_i . k_j + position_bias[h, min(i - j, L - 1)]
                      (+ time_bias[h, time_buckets(query_times_i - timestamps_j, K)] with time buckets)
    a_ij  = silu(s_ij) / L   for j <= i, 0 otherwise
    out_i = sum_j a_ij v_j

Tokens past offsets[-1] let a caller keep a buffer of fixed size (the HSTU model passes all B*L tokens of its
packed rows, the padding at the end): no data-dependent shapes, no device sync.

Backends (`Kernel`, shared with the other ops): TORCH (the sequences padded to M with the jagged ops, one dense
masked computation; any device, and what `torch.compile` is measured on), TRITON (CUDA, or CPU under
TRITON_INTERPRET=1; the custom ops `recsys::hstu_attention_triton` and `..._backward`, each with a fake
implementation, as an autograd.Function's forward and backward, so `torch.compile` traces through it without a
graph break), FBGEMM (none: requesting it raises).
`kernel=None` picks TRITON on CUDA when Triton is installed, else TORCH; the choice is logged once per (kernel,
device); an explicit request that cannot run raises `KernelUnavailableError` saying what to do.

Gradients flow to q, k, v, position_bias and time_bias (not to the times). TRITON's are deterministic except the
bias gradients on a GPU (atomic adds; see `recsys.ops.triton.hstu_attention`).

Values (offsets rising from 0 to at most N, `max_seq_len` bounding the lengths) are checked on CPU in eager mode
only: on CUDA a check would synchronise the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from recsys.ops import dispatch
from recsys.ops.dispatch import Kernel as Kernel
from recsys.ops.dispatch import KernelUnavailableError as KernelUnavailableError  # re-exported for callers
from recsys.ops.jagged import jagged_to_padded_dense, padded_dense_to_jagged
from recsys.ops.reference.hstu_attention import time_buckets as time_buckets  # the buckets' one definition

_FLOAT_DTYPES = (torch.float32, torch.bfloat16)
_TABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_TRITON_HEAD_DIM = 256  # E; recsys.ops.triton.hstu_attention tiles a whole head


def select_kernel(kernel: Kernel | None, device: torch.device) -> Kernel:
    """The kernel that will run on `device`: `kernel` itself (raising if it cannot), or the best available."""
    return dispatch.select_kernel(
        "hstu_attention", kernel, device, logger_name=__name__, triton_module="hstu_attention",
        fbgemm_missing="Kernel.FBGEMM has no hstu_attention on this platform",
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------- validation


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.ndim != 3 or q.dtype not in _FLOAT_DTYPES:
        raise ValueError(
            f"q must be a (N, H, E) fp32 or bf16 tensor (fp16: use bf16 autocast), got shape {tuple(q.shape)} {q.dtype}"
        )
    for name, tensor in (("k", k), ("v", v)):
        if tensor.shape != q.shape or tensor.dtype != q.dtype or tensor.device != q.device:
            raise ValueError(
                f"{name} must match q: {tuple(q.shape)} {q.dtype} on {q.device}, got {tuple(tensor.shape)} "
                f"{tensor.dtype} on {tensor.device}"
            )


def _check_table(name: str, table: torch.Tensor, heads: int, width: int | None, device: torch.device) -> None:
    """A (heads, width) bias table (width None: any >= 1) in a float dtype on `device`."""
    fits = (
        table.ndim == 2
        and table.shape[0] == heads
        and (table.shape[1] >= 1 if width is None else table.shape[1] == width)
    )
    if not fits or table.dtype not in _TABLE_DTYPES or table.device != device:
        raise ValueError(
            f"{name} must be a ({heads}, {width or 'K >= 1'}) float tensor on {device}, got {tuple(table.shape)} "
            f"{table.dtype} on {table.device}"
        )


def _check_times(
    time_bias: torch.Tensor | None, timestamps: torch.Tensor | None, query_times: torch.Tensor | None, q: torch.Tensor
) -> None:
    if time_bias is None:
        if timestamps is not None or query_times is not None:
            raise ValueError("timestamps / query_times are read with time_bias only: pass time_bias, or neither")
        return
    _check_table("time_bias", time_bias, q.shape[1], None, q.device)
    for name, times in (("timestamps", timestamps), ("query_times", query_times)):
        if times is None or times.shape != (q.shape[0],) or times.dtype != torch.int64 or times.device != q.device:
            got = "None" if times is None else f"{tuple(times.shape)} {times.dtype} on {times.device}"
            raise ValueError(
                f"time_bias needs {name}: a (N,) = ({q.shape[0]},) int64 tensor of seconds on {q.device}, got {got}"
            )


def _check_offsets(offsets: torch.Tensor, q: torch.Tensor, max_seq_len: int | None) -> None:
    if offsets.ndim != 1 or offsets.numel() < 1 or offsets.dtype != torch.int64 or offsets.device != q.device:
        raise ValueError(
            f"offsets must be a non-empty 1-d int64 tensor (S+1 values) on {q.device}, got shape "
            f"{tuple(offsets.shape)} {offsets.dtype} on {offsets.device}"
        )
    if max_seq_len is not None and max_seq_len < 0:
        raise ValueError(f"max_seq_len must be >= 0 (or None to read it from offsets), got {max_seq_len}")
    if offsets.device.type != "cpu" or torch.compiler.is_compiling():
        return
    lengths = offsets.diff()
    if int(offsets[0]) != 0 or int(offsets[-1]) > q.shape[0] or bool((lengths < 0).any()):
        raise ValueError(f"offsets must rise from 0 to at most N={q.shape[0]}, got {offsets.tolist()[:8]}...")
    if max_seq_len is not None and lengths.numel() and int(lengths.max()) > max_seq_len:
        raise ValueError(
            f"max_seq_len={max_seq_len} is below the longest sequence ({int(lengths.max())}): pass a bound on the "
            "lengths, or None to read it from offsets"
        )


def _validate(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    position_bias: torch.Tensor,
    time_bias: torch.Tensor | None,
    timestamps: torch.Tensor | None,
    query_times: torch.Tensor | None,
    max_seq_len: int | None,
) -> None:
    _check_qkv(q, k, v)
    if max_len < 1:
        raise ValueError(f"max_len (the width of position_bias) must be >= 1, got {max_len}")
    _check_table("position_bias", position_bias, q.shape[1], max_len, q.device)
    _check_times(time_bias, timestamps, query_times, q)
    _check_offsets(offsets, q, max_seq_len)


# ------------------------------------------------------------------------------------------- TORCH backend


def _torch_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    max_len: int,
    position_bias: torch.Tensor,
    time_bias: torch.Tensor | None,
    timestamps: torch.Tensor | None,
    query_times: torch.Tensor | None,
    max_seq_len: int,
) -> torch.Tensor:
    """(N, H, E): the sequences padded to (S+1, M) rows, one masked dense computation, back to jagged.

    Row S holds the tokens past offsets[-1] (so the jagged ops see all N tokens) and counts as empty: its
    outputs are 0. Dot products run in the inputs' dtype (bf16 under autocast), the rest in fp32.
    """
    num_tokens, num_heads, head_dim = q.shape
    if num_tokens == 0 or max_seq_len == 0:
        return q.new_zeros(q.shape)
    rows = torch.cat([offsets, offsets.new_full((1,), num_tokens)])  # (S+2,)
    lengths = F.pad(offsets.diff(), (0, 1))  # (S+1,), the trailing row empty
    qd, kd, vd = (
        jagged_to_padded_dense(t.flatten(1), rows, max_seq_len, kernel=Kernel.TORCH)
        .view(-1, max_seq_len, num_heads, head_dim)
        .transpose(1, 2)
        for t in (q, k, v)
    )  # (S+1, H, M, E) each
    position = torch.arange(max_seq_len, device=q.device)
    distance = position[:, None] - position[None, :]  # (M, M) query - key
    bias = position_bias.float()[:, distance.clamp(0, max_len - 1)]  # (H, M, M)
    if time_bias is not None:
        assert timestamps is not None and query_times is not None
        token = (rows[:-1, None] + position).clamp(max=num_tokens - 1)  # (S+1, M) token of each position
        gaps = query_times[token][:, :, None] - timestamps[token][:, None, :]  # (S+1, M, M)
        bias = bias + time_bias.float()[:, time_buckets(gaps, time_bias.shape[1])].transpose(0, 1)  # (S+1, H, M, M)
    scores = (qd @ kd.transpose(-1, -2)).float() + bias  # (S+1, H, M, M)
    real = position < lengths[:, None]  # (S+1, M)
    mask = (distance >= 0) & real[:, None, :, None] & real[:, None, None, :]  # (S+1, 1, M, M)
    weights = F.silu(scores) * mask / max_len
    out = (weights.to(vd.dtype) @ vd).transpose(1, 2).flatten(2)  # (S+1, M, H*E)
    return padded_dense_to_jagged(out, rows, total_length=num_tokens, kernel=Kernel.TORCH).view(q.shape)


# -------------------------------------------------------------------------- TRITON backend as custom ops
# Each step is a plain function (what eager mode calls) and a custom op of it (what torch.compile traces, through its
# fake implementation). Tensors that are absent (no time buckets) cross the op boundary as None inputs and an empty
# output.


def _triton_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    position_bias: torch.Tensor,
    time_bias: torch.Tensor | None,
    timestamps: torch.Tensor | None,
    query_times: torch.Tensor | None,
    max_len: int,
    max_seq_len: int,
) -> torch.Tensor:
    out: torch.Tensor = dispatch.triton_backend("hstu_attention", q.device).forward(
        q, k, v, offsets, max_len=max_len, position_bias=position_bias, time_bias=time_bias,
        timestamps=timestamps, query_times=query_times, max_seq_len=max_seq_len,
    )  # fmt: skip
    return out


_triton_op = torch.library.custom_op("recsys::hstu_attention_triton", _triton_forward, mutates_args=())


@_triton_op.register_fake
def _triton_op_fake(q: torch.Tensor, *args: Any) -> torch.Tensor:
    return q.new_empty(q.shape)


def _triton_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    position_bias: torch.Tensor,
    time_bias: torch.Tensor | None,
    timestamps: torch.Tensor | None,
    query_times: torch.Tensor | None,
    max_len: int,
    max_seq_len: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, d position_bias, d time_bias (an empty tensor without time buckets))."""
    dq, dk, dv, dpos, dtime = dispatch.triton_backend("hstu_attention", q.device).backward(
        grad_out, q, k, v, offsets, max_len=max_len, position_bias=position_bias, time_bias=time_bias,
        timestamps=timestamps, query_times=query_times, max_seq_len=max_seq_len,
    )  # fmt: skip
    return dq, dk, dv, dpos, position_bias.new_empty(0) if dtime is None else dtime


_triton_backward_op = torch.library.custom_op(
    "recsys::hstu_attention_triton_backward", _triton_backward, mutates_args=()
)


@_triton_backward_op.register_fake
def _triton_backward_fake(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    position_bias: torch.Tensor,
    time_bias: torch.Tensor | None,
    *args: Any,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = (q.new_empty(q.shape) for _ in range(3))
    dtime = position_bias.new_empty(0) if time_bias is None else time_bias.new_empty(time_bias.shape)
    return dq, dk, dv, position_bias.new_empty(position_bias.shape), dtime


class _TritonAttention(torch.autograd.Function):
    """The TRITON backend's autograd: the forward and backward steps, as custom ops while torch.compile traces and as
    plain calls in eager mode. Not the op's `register_autograd`, nor the ops in eager mode: at the model's short
    shapes the host's time per call is the call's time, and torch.library's generated autograd wrapper alone took
    0.44 ms of it on an H100 (the kernel 0.02; docs/kernels.md, "The host path without torch.library's autograd
    wrapper")."""

    @staticmethod
    def forward(ctx: Any, *inputs: Any) -> torch.Tensor:
        """`inputs`: `_triton_forward`'s arguments (its tensors, then max_len and max_seq_len)."""
        *tensors, max_len, max_seq_len = inputs
        ctx.save_for_backward(*tensors)
        ctx.max_len, ctx.max_seq_len = max_len, max_seq_len
        step = _triton_op if torch.compiler.is_compiling() else _triton_forward
        out: torch.Tensor = step(*inputs)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        tensors = ctx.saved_tensors
        step: Callable[..., tuple[torch.Tensor, ...]] = (
            _triton_backward_op if torch.compiler.is_compiling() else _triton_backward
        )
        dq, dk, dv, dpos, dtime = step(grad_out, *tensors, ctx.max_len, ctx.max_seq_len)
        has_time = tensors[5] is not None
        return dq, dk, dv, None, dpos, dtime if has_time else None, None, None, None, None


# -------------------------------------------------------------------------------------------------- the API


def hstu_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    *,
    max_len: int,
    position_bias: torch.Tensor,
    time_bias: torch.Tensor | None = None,
    timestamps: torch.Tensor | None = None,
    query_times: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    kernel: Kernel | None = None,
) -> torch.Tensor:
    """HSTU attention of jagged sequences (formulas and layout in the module docstring).

    Differentiable w.r.t. q, k, v, position_bias and time_bias.

    Args:
        q, k, v: (N, H, E) fp32 or bf16 (dot products run in this dtype, everything else in fp32); any strides.
        offsets: (S+1,) int64 rising from 0 to at most N; tokens past offsets[-1] get 0.
        max_len: L, the width of `position_bias`: distances from L - 1 on share its last column, and the
            attention weights are divided by L (the model's max_history).
        position_bias: (H, L) float.
        time_bias: (H, K) float, one column per time bucket (`time_buckets`); None = positions only.
        timestamps: (N,) int64 seconds of every token as a key (with `time_bias` only).
        query_times: (N,) int64 seconds every token predicts for, as a query (with `time_bias` only).
        max_seq_len: M >= every sequence's length (the padded width of TORCH, the grid of TRITON); None = read
            from offsets, a device sync on CUDA and a graph break under torch.compile.
        kernel: the backend; None = TRITON on CUDA when available, else TORCH.

    Returns:
        (N, H, E) in the dtype of q.

    Example:
        >>> q = k = v = torch.ones(3, 1, 2)   # N=3 tokens, H=1 head, E=2: sequences [t0 t1] and [t2]
        >>> out = hstu_attention(q, k, v, torch.tensor([0, 2, 3]), max_len=4, position_bias=torch.zeros(1, 4),
        ...                      kernel=Kernel.TORCH)
        >>> out[:, 0, 0]   # silu(q.k = 2) / 4 = 0.4404 per key at or before the query
        tensor([0.4404, 0.8808, 0.4404])
    """
    _validate(q, k, v, offsets, max_len, position_bias, time_bias, timestamps, query_times, max_seq_len)
    chosen = select_kernel(kernel, q.device)
    if max_seq_len is None:
        max_seq_len = int(offsets.diff().max()) if offsets.numel() > 1 else 0  # a device sync on CUDA
    if chosen is Kernel.TORCH:
        return _torch_attention(
            q, k, v, offsets, max_len, position_bias, time_bias, timestamps, query_times, max_seq_len
        )
    if q.shape[2] > MAX_TRITON_HEAD_DIM:
        raise ValueError(
            f"head dim E={q.shape[2]} is wider than the Triton kernels tile (<= {MAX_TRITON_HEAD_DIM}): use more "
            "heads, or kernel=Kernel.TORCH"
        )
    tables = position_bias.contiguous(), None if time_bias is None else time_bias.contiguous()
    out: torch.Tensor = _TritonAttention.apply(q, k, v, offsets, *tables, timestamps, query_times, max_len, max_seq_len)
    return out
