"""Jagged helpers the GPU path needs without CUDA fbgemm: complete cumsum, jagged -> padded dense and back.

fbgemm's CPU build (`fbgemm-gpu-cpu`) rejects CUDA tensors in its `torch.ops.fbgemm.*` ops, and a machine may have
only that build beside a CUDA torch; these are our own versions of `asynchronous_complete_cumsum`,
`jagged_to_padded_dense` and `dense_to_jagged`, with the same semantics (a test checks the reference against fbgemm
on CPU).

Dimension letters: B rows (the batch), L the padded length, D the width of each value, N values (all rows).

Layout (the platform's `recsys.data.jagged.Jagged`; B=3, L=2)::

    lengths  (B,)       [2, 0, 3]
    offsets  (B+1,)     [0, 2, 2, 5]                    = complete_cumsum(lengths)
    values   (N, D)     [v0 v1 | v2 v3 v4]              row b = values[offsets[b]:offsets[b+1]]
    dense    (B, L, D)  [[v0, v1], [p, p], [v2, v3]]    p = padding_value; v4 is truncated (row longer than L)

    padded_dense_to_jagged(dense, offsets) = [v0 v1 | v2 v3 0]: positions >= L come back as 0.

Backends (`Kernel`, shared with `recsys.ops.embedding_bag`): TORCH (vectorised PyTorch, any device, no
device sync when the sizes are passed), TRITON (CUDA, or CPU under TRITON_INTERPRET=1), FBGEMM (reserved:
requesting it raises). `kernel=None` picks TRITON on CUDA when Triton is installed, else TORCH, except
for `complete_cumsum`, where it always picks TORCH (the Triton scan is a single program, see
`recsys.ops.triton.jagged`). The choice is logged once per (op, kernel, device); an explicit request that
cannot run raises `KernelUnavailableError` saying what to do; nothing is swapped silently.

Gradients: `jagged_to_padded_dense` and `padded_dense_to_jagged` are differentiable w.r.t. their float
input, each one's backward being the other conversion of the output gradient (padding positions get no
gradient; jagged values truncated away get 0). The backward is itself differentiable.

Values (offsets rising from 0 to N) are checked on CPU only: on CUDA a check would synchronise the device.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from recsys.ops import dispatch
from recsys.ops.dispatch import Kernel as Kernel
from recsys.ops.dispatch import KernelUnavailableError as KernelUnavailableError  # re-exported for callers

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_INDEX_DTYPES = (torch.int32, torch.int64)


def select_kernel(kernel: Kernel | None, device: torch.device, op: str = "jagged_to_padded_dense") -> Kernel:
    """The kernel that will run `op` on `device`: `kernel` itself (raising if it cannot), or the best available."""
    default = None
    if op == "complete_cumsum":
        default = (Kernel.TORCH, "chosen by default: torch.cumsum scales, the Triton scan is one program")
    return dispatch.select_kernel(
        op, kernel, device, logger_name=__name__, triton_module="jagged", default=default,
        fbgemm_missing=f"Kernel.FBGEMM is reserved for {op}: fbgemm's CPU build rejects CUDA tensors. Fix: pass "
        "kernel=Kernel.TORCH or Kernel.TRITON (the default picks one)",
    )  # fmt: skip


def _triton_backend(device: torch.device) -> ModuleType:
    return dispatch.triton_backend("jagged", device)


# ----------------------------------------------------------------------------------------------- validation


def _check_offsets(offsets: torch.Tensor, device: torch.device) -> None:
    if offsets.ndim != 1 or offsets.numel() < 1 or offsets.dtype not in _INDEX_DTYPES:
        raise ValueError(
            f"offsets must be a non-empty 1-d int32/int64 tensor (B+1 values), got shape {tuple(offsets.shape)} "
            f"{offsets.dtype}"
        )
    if offsets.device != device:
        raise ValueError(f"offsets is on {offsets.device} but the data is on {device}")


def _check_offset_values(offsets: torch.Tensor, total_length: int) -> None:
    """On CPU only: offsets rise from 0 to `total_length` (N)."""
    if offsets.device.type != "cpu":
        return
    if int(offsets[0]) != 0 or int(offsets[-1]) != total_length or bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(f"offsets must rise from 0 to N={total_length}, got {offsets.tolist()[:8]}...")


def _check_float(name: str, tensor: torch.Tensor, ndim: int, shape: str) -> None:
    if tensor.ndim != ndim or tensor.dtype not in _FLOAT_DTYPES:
        raise ValueError(
            f"{name} must be a {shape} fp32/bf16/fp16 tensor, got shape {tuple(tensor.shape)} {tensor.dtype}"
        )


# ------------------------------------------------------------------------------------------- TORCH backend


def _torch_to_dense(values: torch.Tensor, offsets: torch.Tensor, max_length: int, padding_value: float) -> torch.Tensor:
    """(B, L, D) by one gather: position p of row b reads values[offsets[b] + p] when p < len(b)."""
    batch_size, dim = offsets.numel() - 1, values.shape[1]
    if values.shape[0] == 0 or batch_size * max_length * dim == 0:
        return values.new_full((batch_size, max_length, dim), padding_value)
    offsets = offsets.long()
    positions = torch.arange(max_length, device=values.device)  # (L,)
    source = (offsets[:-1, None] + positions).clamp(max=values.shape[0] - 1)  # (B, L)
    in_row = positions < (offsets[1:] - offsets[:-1])[:, None]  # (B, L)
    return torch.where(in_row[..., None], values[source], values.new_full((), padding_value))


def _torch_to_jagged(dense: torch.Tensor, offsets: torch.Tensor, total_length: int) -> torch.Tensor:
    """(N, D) by one gather: value n of row b reads dense[b, n - offsets[b]] when that position is < L."""
    batch_size, max_length, dim = dense.shape
    if total_length == 0 or max_length == 0 or dim == 0:
        return dense.new_zeros(total_length, dim)
    offsets = offsets.long()
    # output_size: N is known on the host, so no device sync on CUDA.
    row = torch.repeat_interleave(
        torch.arange(batch_size, device=dense.device), offsets[1:] - offsets[:-1], output_size=total_length
    )  # (N,)
    position = torch.arange(total_length, device=dense.device) - offsets[:-1][row]  # (N,)
    kept = dense[row, position.clamp(max=max_length - 1)]  # (N, D)
    return torch.where((position < max_length)[:, None], kept, dense.new_zeros(()))


# ------------------------------------------------------------------------------------------------ autograd


def _to_dense(
    kernel: Kernel, values: torch.Tensor, offsets: torch.Tensor, max_length: int, padding_value: float
) -> torch.Tensor:
    if kernel is Kernel.TORCH:
        return _torch_to_dense(values, offsets, max_length, padding_value)
    out: torch.Tensor = _triton_backend(values.device).jagged_to_padded_dense(
        values, offsets, max_length, padding_value
    )
    return out


def _to_jagged(kernel: Kernel, dense: torch.Tensor, offsets: torch.Tensor, total_length: int) -> torch.Tensor:
    if kernel is Kernel.TORCH:
        return _torch_to_jagged(dense, offsets, total_length)
    out: torch.Tensor = _triton_backend(dense.device).padded_dense_to_jagged(dense, offsets, total_length=total_length)
    return out


class _JaggedToPaddedDense(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, values: torch.Tensor, offsets: torch.Tensor, max_length: int, padding_value: float, kernel: Kernel
    ) -> torch.Tensor:
        ctx.save_for_backward(offsets)
        ctx.total_length = values.shape[0]
        ctx.kernel = kernel
        return _to_dense(kernel, values, offsets, max_length, padding_value)

    @staticmethod
    def backward(ctx: Any, grad_dense: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (offsets,) = ctx.saved_tensors
        # Through the other Function, so that the backward is differentiable too (create_graph=True).
        grad_values = _PaddedDenseToJagged.apply(grad_dense, offsets, ctx.total_length, ctx.kernel)
        return grad_values, None, None, None, None


class _PaddedDenseToJagged(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, dense: torch.Tensor, offsets: torch.Tensor, total_length: int, kernel: Kernel
    ) -> torch.Tensor:
        ctx.save_for_backward(offsets)
        ctx.max_length = dense.shape[1]
        ctx.kernel = kernel
        return _to_jagged(kernel, dense, offsets, total_length)

    @staticmethod
    def backward(ctx: Any, grad_values: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (offsets,) = ctx.saved_tensors
        grad_dense = _JaggedToPaddedDense.apply(grad_values, offsets, ctx.max_length, 0.0, ctx.kernel)
        return grad_dense, None, None, None


# -------------------------------------------------------------------------------------------------- the API


def complete_cumsum(lengths: torch.Tensor, *, kernel: Kernel | None = None) -> torch.Tensor:
    """Offsets of jagged rows from their lengths: [0, l0, l0+l1, ...] (fbgemm's asynchronous_complete_cumsum).

    Args:
        lengths: (B,) int32/int64 lengths of the rows.
        kernel: TORCH (torch.cumsum) or TRITON (a single-program scan, for batch-sized inputs);
            None = TORCH on every device.

    Returns:
        (B+1,) int64 offsets (fbgemm keeps the lengths' dtype; ours are always int64).

    Example:
        >>> complete_cumsum(torch.tensor([2, 0, 3]), kernel=Kernel.TORCH).tolist()
        [0, 2, 2, 5]
    """
    if lengths.ndim != 1 or lengths.dtype not in _INDEX_DTYPES:
        raise ValueError(f"lengths must be a 1-d int32/int64 tensor, got shape {tuple(lengths.shape)} {lengths.dtype}")
    if lengths.device.type == "cpu" and bool((lengths < 0).any()):
        raise ValueError(f"lengths must be >= 0, got {lengths.tolist()[:8]}...")
    if select_kernel(kernel, lengths.device, "complete_cumsum") is Kernel.TRITON:
        out: torch.Tensor = _triton_backend(lengths.device).complete_cumsum(lengths)
        return out
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, dim=0, dtype=torch.int64, out=offsets[1:])
    return offsets


def jagged_to_padded_dense(
    values: torch.Tensor,
    offsets: torch.Tensor,
    max_length: int,
    padding_value: float = 0.0,
    *,
    kernel: Kernel | None = None,
) -> torch.Tensor:
    """Jagged rows as a padded (B, L, D) tensor, rows longer than L truncated (fbgemm's jagged_to_padded_dense).

    Differentiable w.r.t. `values`: the gradient is `padded_dense_to_jagged` of the output gradient.

    Args:
        values: (N, D) fp32/bf16/fp16, all rows concatenated.
        offsets: (B+1,) int32/int64, row b = values[offsets[b]:offsets[b+1]].
        max_length: L >= 0; each row keeps its first L values.
        padding_value: fills positions past a row's end (rounded to the values' dtype).
        kernel: the backend; None = TRITON on CUDA when available, else TORCH.

    Returns:
        (B, L, D) in the values' dtype.

    Example:
        >>> values = torch.tensor([[1.0], [2.0], [3.0], [4.0], [5.0]])   # rows [1, 2], [], [3, 4, 5]
        >>> jagged_to_padded_dense(values, torch.tensor([0, 2, 2, 5]), 2, -1.0, kernel=Kernel.TORCH)[..., 0]
        tensor([[ 1.,  2.],
                [-1., -1.],
                [ 3.,  4.]])
    """
    _check_float("values", values, 2, "(N, D)")
    _check_offsets(offsets, values.device)
    if max_length < 0:
        raise ValueError(f"max_length must be >= 0, got {max_length}")
    _check_offset_values(offsets, values.shape[0])
    chosen = select_kernel(kernel, values.device, "jagged_to_padded_dense")
    out: torch.Tensor = _JaggedToPaddedDense.apply(values, offsets, max_length, float(padding_value), chosen)
    return out


def padded_dense_to_jagged(
    dense: torch.Tensor,
    offsets: torch.Tensor,
    *,
    total_length: int | None = None,
    kernel: Kernel | None = None,
) -> torch.Tensor:
    """Jagged values read from padded (B, L, D) rows (fbgemm's dense_to_jagged); positions >= L come back as 0.

    Differentiable w.r.t. `dense`: the gradient is `jagged_to_padded_dense` of the values' gradient (padding 0).

    Args:
        dense: (B, L, D) fp32/bf16/fp16.
        offsets: (B+1,) int32/int64, the layout of the result: row b = values[offsets[b]:offsets[b+1]].
        total_length: N = offsets[-1]; pass it on CUDA to avoid a device sync (None = read offsets[-1]).
        kernel: the backend; None = TRITON on CUDA when available, else TORCH.

    Returns:
        (N, D) in the dense dtype.

    Example:
        >>> dense = torch.tensor([[[1.0], [2.0]], [[9.0], [9.0]], [[3.0], [4.0]]])   # (B=3, L=2, D=1)
        >>> padded_dense_to_jagged(dense, torch.tensor([0, 2, 2, 5]), kernel=Kernel.TORCH)[:, 0]
        tensor([1., 2., 3., 4., 0.])
    """
    _check_float("dense", dense, 3, "(B, L, D)")
    _check_offsets(offsets, dense.device)
    if offsets.numel() - 1 != dense.shape[0]:
        raise ValueError(
            f"offsets must hold B+1 = {dense.shape[0] + 1} values for dense (B, L, D), got {offsets.numel()}"
        )
    if total_length is None:
        total_length = int(offsets[-1])  # a device sync on CUDA
    if total_length < 0:
        raise ValueError(f"total_length must be >= 0, got {total_length}")
    _check_offset_values(offsets, total_length)
    chosen = select_kernel(kernel, dense.device, "padded_dense_to_jagged")
    out: torch.Tensor = _PaddedDenseToJagged.apply(dense, offsets, total_length, chosen)
    return out
