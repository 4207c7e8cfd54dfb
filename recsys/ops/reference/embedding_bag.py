"""Ground truth for the embedding-bag op: plain PyTorch, every sum in fp32.

Dimension letters: T tables, B bags per table (the batch), D embedding dim, N ids (all tables),
R rows of the flat weights buffer (all tables), U unique rows touched by a batch.

Layout (the one of torchrec's `KeyedJaggedTensor` and `KeyedTensor`, T=2 tables, B=2)::

    weights      (R, D)    table 0 = rows 0..R0-1, table 1 = rows R0..R-1, ...
    row_offsets  (T+1,)    [0, R0, R]: table t is weights[row_offsets[t]:row_offsets[t+1]]
    indices      (N,)      ids local to their table, table-major then bag-major:
                           [t0 b0 ids | t0 b1 ids | t1 b0 ids | t1 b1 ids]
    offsets      (T*B+1,)  bag t*B+b is indices[offsets[t*B+b]:offsets[t*B+b+1]]
    output       (B, T*D)  output[b, t*D:(t+1)*D] = pooled bag t*B+b

The reference is differentiable through autograd and gives *dense* gradients; the fast backends
return row-sparse ones (see `recsys.ops.embedding_bag`).
"""

from __future__ import annotations

from typing import Literal

import torch

Pooling = Literal["sum", "mean"]


def bag_and_row_of_ids(
    indices: torch.Tensor, offsets: torch.Tensor, row_offsets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """For every id: its bag t*B+b and its row in the flat weights buffer, both (N,) int64."""
    num_tables = row_offsets.numel() - 1
    num_bags = offsets.numel() - 1
    lengths = offsets[1:] - offsets[:-1]
    # output_size avoids a device sync on CUDA: the number of ids is known on the host.
    bag = torch.repeat_interleave(torch.arange(num_bags, device=indices.device), lengths, output_size=indices.numel())
    batch_size = num_bags // num_tables if num_tables else 0
    table = bag // max(batch_size, 1)
    return bag, row_offsets[table] + indices


def id_scales(
    offsets: torch.Tensor, bag: torch.Tensor, pooling: Pooling, per_sample_weights: torch.Tensor | None
) -> torch.Tensor | None:
    """Each id's factor in its bag's sum, (N,) fp32: its weight, divided by the bag length for "mean".

    None when every factor is 1 (unweighted "sum").
    """
    scale = None if per_sample_weights is None else per_sample_weights.float()
    if pooling == "mean":
        lengths = (offsets[1:] - offsets[:-1])[bag].clamp(min=1).float()
        scale = 1.0 / lengths if scale is None else scale / lengths
    return scale


def embedding_bag(
    weights: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    row_offsets: torch.Tensor | None = None,
    *,
    pooling: Pooling = "sum",
    per_sample_weights: torch.Tensor | None = None,
    output_dtype: torch.dtype | None = torch.float32,
) -> torch.Tensor:
    """Pooled lookups of T tables, computed in fp32.

    Args:
        weights: (R, D) all tables row-concatenated, any float dtype.
        indices: (N,) int64 ids local to their table.
        offsets: (T*B+1,) int64.
        row_offsets: (T+1,) int64 first row of each table in `weights`; None = one table, all rows.
        pooling: "sum" or "mean" (mean of an empty bag = 0; with per-sample weights: sum(w_i * row_i) / len).
        per_sample_weights: (N,) float, optional.
        output_dtype: dtype of the result; the reference defaults to fp32.

    Returns:
        (B, T*D) pooled embeddings, table t in columns t*D:(t+1)*D.
    """
    if row_offsets is None:
        row_offsets = torch.tensor([0, weights.shape[0]], dtype=torch.int64, device=weights.device)
    num_tables = row_offsets.numel() - 1
    batch_size = (offsets.numel() - 1) // num_tables
    dim = weights.shape[1]
    bag, rows = bag_and_row_of_ids(indices, offsets, row_offsets)
    values = weights.float()[rows]  # (N, D)
    scale = id_scales(offsets, bag, pooling, per_sample_weights)
    if scale is not None:
        values = values * scale[:, None]
    pooled = torch.zeros(num_tables * batch_size, dim, dtype=torch.float32, device=weights.device)
    pooled = pooled.index_add(0, bag, values)  # (T*B, D)
    out = pooled.view(num_tables, batch_size, dim).transpose(0, 1).reshape(batch_size, num_tables * dim)
    return out.to(output_dtype or torch.float32)


def sgd_update(weights: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
    """New weights after one SGD step on a dense (R, D) gradient; math in fp32, result in the table dtype."""
    return (weights.float() - lr * grad.float()).to(weights.dtype)


def adam_update(
    weights: torch.Tensor,
    momentum1: torch.Tensor,
    momentum2: torch.Tensor,
    grad: torch.Tensor,
    touched: torch.Tensor,
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """New (weights, momentum1, momentum2) after one lazy Adam step on the `touched` rows (R,) bool; math in fp32.

    Only touched rows move (SparseAdam's and FBGEMM's semantics: an untouched row's moments do not decay).
    `momentum2` of shape (R, D) is Adam's; of shape (R,) it is row-wise (FBGEMM's PARTIAL_ROWWISE_ADAM: the
    mean over D of g**2). `step` counts this update (1 for the first): bias corrections 1 - beta**step.
    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g**2;  w -= lr * (m / (1 - b1**t)) / (sqrt(v / (1 - b2**t)) + eps).
    """
    g = grad.float()
    rows = touched[:, None]
    m = torch.where(rows, beta1 * momentum1 + (1 - beta1) * g, momentum1)
    if momentum2.ndim == 1:
        v = torch.where(touched, beta2 * momentum2 + (1 - beta2) * (g * g).mean(dim=1), momentum2)
        denom = ((v / (1 - beta2**step)).sqrt() + eps)[:, None]
    else:
        v = torch.where(rows, beta2 * momentum2 + (1 - beta2) * g * g, momentum2)
        denom = (v / (1 - beta2**step)).sqrt() + eps
    new_weights = torch.where(rows, weights.float() - lr * (m / (1 - beta1**step)) / denom, weights.float())
    return new_weights.to(weights.dtype), m, v


def stochastic_round_to_bf16(values: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """fp32 -> bf16 rounded up or down at random, with the probability that makes the rounding unbiased.

    Adds 16 random low bits to the fp32 bit pattern, then truncates them: a value a fraction p of the way
    from one bf16 neighbour to the next rounds up with probability p (updates smaller than half a bf16 ulp,
    which round-to-nearest drops every time, survive on average).
    """
    bits = values.float().contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=bits.device, generator=generator)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)  # -65536 = 0xFFFF0000


def rowwise_adagrad_update(
    weights: torch.Tensor, state: torch.Tensor, grad: torch.Tensor, lr: float, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """New (weights (R, D), state (R,) fp32) after one exact row-wise Adagrad step on a dense (R, D) gradient.

    FBGEMM's EXACT_ROWWISE_ADAGRAD: state[r] += mean_d(g[r, d]**2); w[r] -= lr * g[r] / (sqrt(state[r]) + eps).
    Rows with a zero gradient keep their weights and state, so the dense form equals the row-sparse one.
    """
    g = grad.float()
    new_state = state + (g * g).mean(dim=1)
    new_weights = weights.float() - lr * g / (new_state.sqrt() + eps)[:, None]
    return new_weights.to(weights.dtype), new_state
