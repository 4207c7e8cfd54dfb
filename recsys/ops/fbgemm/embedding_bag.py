"""`Kernel.FBGEMM` for `recsys.ops.embedding_bag`: FBGEMM's dense TBE op, which brings its own autograd.

`torch.ops.fbgemm.dense_embedding_codegen_lookup_function` pools T tables stored in one flat buffer in a
single call (the layout of `recsys.ops.embedding_bag`: tables row-concatenated, ids local to their table,
KJT offsets) and differentiates w.r.t. that buffer, giving a *dense* table gradient. What it does not do
raises `KernelUnavailableError` with the alternative, never a silent fallback:

- a sparse table gradient (`sparse_grad=True` on a weights tensor that requires grad);
- gradients w.r.t. per-sample weights, and the table gradient of a weighted "mean" (FBGEMM's CPU backward
  leaves out the 1/len its forward applies: a test pins that difference);
- bf16 tables on CPU (fbgemm's CPU kernels have no bf16 instantiation);
- `deterministic=True` (FBGEMM chooses its own summation order);
- CUDA tensors with fbgemm's CPU build (`fbgemm-gpu-cpu` rejects them).

The fused optimizers belong to FBGEMM's TBE module (`SplitTableBatchedEmbeddingBagsCodegen`), which owns
its weights; `fused_backward_update` and `embedding_bag_backward` therefore have no FBGEMM backend.
"""

from __future__ import annotations

import functools

import torch

from recsys.ops.dispatch import KernelUnavailableError

_OP = "dense_embedding_codegen_lookup_function"
# fbgemm's SparseType codes (fbgemm_gpu.split_embedding_configs.SparseType.as_int()).
_SPARSE_TYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 5}
_POOLING_MODE = {"sum": 0, "mean": 1}  # fbgemm's PoolingMode


@functools.cache
def runs_on(device_type: str) -> bool:
    """Whether the installed fbgemm_gpu has a kernel of the dense TBE op for this device type."""
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)

    dispatch_key = {"cpu": "CPU", "cuda": "CUDA"}.get(device_type)
    return dispatch_key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(f"fbgemm::{_OP}", dispatch_key)


def forward(
    weights: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    row_offsets: torch.Tensor,
    *,
    pooling: str,
    per_sample_weights: torch.Tensor | None,
    output_dtype: torch.dtype,
    sparse_grad: bool,
    deterministic: bool,
) -> torch.Tensor:
    """(B, T*D) pooled lookups; arguments as in `recsys.ops.embedding_bag.embedding_bag` (already validated)."""
    _check_supported(weights, per_sample_weights, pooling, sparse_grad, deterministic)
    num_tables, dim = row_offsets.numel() - 1, weights.shape[1]
    table_dims = torch.arange(num_tables + 1, dtype=torch.int32, device=weights.device) * dim
    out: torch.Tensor = torch.ops.fbgemm.dense_embedding_codegen_lookup_function(
        dev_weights=weights.contiguous().view(-1),  # a view: the gradient flows back to `weights`
        weights_offsets=row_offsets[:-1] * dim,  # first element of each table
        D_offsets=table_dims,
        total_D=num_tables * dim,
        max_D=dim,
        hash_size_cumsum=row_offsets,
        total_hash_size_bits=max(int(weights.shape[0]).bit_length(), 1),
        indices=indices,
        offsets=offsets,
        pooling_mode=_POOLING_MODE[pooling],
        indice_weights=None if per_sample_weights is None else per_sample_weights.float(),
        feature_requires_grad=None,
        output_dtype=_SPARSE_TYPE[output_dtype],
    )
    return out.to(output_dtype)  # fbgemm's CPU kernels write fp32 whatever output_dtype asks


def _check_supported(
    weights: torch.Tensor,
    per_sample_weights: torch.Tensor | None,
    pooling: str,
    sparse_grad: bool,
    deterministic: bool,
) -> None:
    if deterministic:
        raise KernelUnavailableError(
            "Kernel.FBGEMM makes no promise on its summation order: drop deterministic=True, or use Kernel.TRITON "
            "(always deterministic) / Kernel.TORCH"
        )
    if weights.requires_grad and sparse_grad:
        raise KernelUnavailableError(
            "Kernel.FBGEMM gives a dense table gradient (FBGEMM's dense TBE): pass sparse_grad=False, or use "
            "Kernel.TRITON / Kernel.TORCH for a row-sparse gradient"
        )
    if per_sample_weights is not None and per_sample_weights.requires_grad:
        raise KernelUnavailableError(
            "Kernel.FBGEMM does not differentiate w.r.t. per_sample_weights: detach them, or use Kernel.TRITON / "
            "Kernel.TORCH"
        )
    if per_sample_weights is not None and pooling == "mean" and weights.requires_grad:
        raise KernelUnavailableError(
            "Kernel.FBGEMM's backward of a weighted mean leaves out the 1/len its forward applies: use "
            "Kernel.TRITON / Kernel.TORCH to train weighted mean bags (a forward without gradient is fine)"
        )
    if weights.dtype == torch.bfloat16 and weights.device.type == "cpu":
        raise KernelUnavailableError(
            "fbgemm's CPU kernels have no bf16 tables: use fp32 or fp16 weights, or Kernel.TORCH on CPU"
        )
