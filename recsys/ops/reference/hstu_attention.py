"""Ground truth for HSTU attention: plain PyTorch in fp32, one sequence at a time, dense within each sequence.

Dimension letters: S sequences, N tokens (all sequences), H heads, E head dim, L the position-bias width
(`max_len`), K time buckets.

Layout (S=3 sequences of lengths 2, 0, 3, and one trailing token)::

    q, k, v     (N, H, E)   [t0 t1 | t2 t3 t4 | t5]     any strides (chunks of one linear output)
    offsets     (S+1,)      [0, 2, 2, 5]                sequence s = tokens offsets[s]:offsets[s+1]
    output      (N, H, E)   [o0 o1 | o2 o3 o4 | 0]      tokens past offsets[-1] belong to no sequence: 0

Per head h, for query i and key j of the same sequence (positions i, j counted inside it):

    s_ij = q_i . k_j + position_bias[h, min(i - j, L - 1)]
                     (+ time_bias[h, time_buckets(query_times_i - timestamps_j, K)] with time buckets)
    a_ij = silu(s_ij) / L   for j <= i, 0 otherwise
    out_i = sum_j a_ij v_j

All arithmetic is fp32; the output is rounded once to the inputs' dtype. Differentiable through autograd
w.r.t. q, k, v, position_bias and time_bias.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def time_buckets(gaps: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """Time gaps in seconds -> bucket ids in [0, num_buckets): 0 for gaps under 1 s, then one bucket per doubling
    (1 s, 2-3 s, 4-7 s, ...), the last one open-ended. Negative gaps (keys after the query, masked) map to 0.

    Example:
        >>> time_buckets(torch.tensor([0, 1, 3, 4, 3600, 10**9]), 8).tolist()
        [0, 1, 2, 3, 7, 7]
    """
    # the count of powers of two <= gap, by comparison: CUDA's log2 of an exact power of two may round below it
    powers = 2 ** torch.arange(min(num_buckets - 1, 63), device=gaps.device, dtype=torch.int64)
    return torch.bucketize(gaps.long(), powers, right=True)


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
) -> torch.Tensor:
    """(N, H, E) HSTU attention of jagged sequences (see the module docstring), computed sequence by sequence.

    Args:
        q, k, v: (N, H, E) float.
        offsets: (S+1,) int64, rising from 0 to at most N.
        max_len: L, the width of `position_bias`; distances from L - 1 on share its last column, and the
            attention weights are divided by L.
        position_bias: (H, L) float.
        time_bias: (H, K) float, or None for no time buckets.
        timestamps, query_times: (N,) int64 seconds of every key and every query (with `time_bias` only).
        max_seq_len: a bound on the sequence lengths that the fast backends size their grids with; checked here.
    """
    lengths = (offsets[1:] - offsets[:-1]).tolist()
    if max_seq_len is not None and max(lengths, default=0) > max_seq_len:
        raise ValueError(f"max_seq_len={max_seq_len} is below the longest sequence ({max(lengths)})")
    position_bias32 = position_bias.float()
    time_bias32 = None if time_bias is None else time_bias.float()
    parts = []
    for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        gaps = None
        if timestamps is not None and query_times is not None:
            gaps = query_times[start:end, None] - timestamps[None, start:end]  # (n, n)
        q_s, k_s, v_s = (t[start:end].float() for t in (q, k, v))  # (n, H, E) each
        parts.append(
            _attend(q_s, k_s, v_s, gaps, max_len=max_len, position_bias=position_bias32, time_bias=time_bias32)
        )
    trailing = q.new_zeros(q.shape[0] - int(offsets[-1]), *q.shape[1:], dtype=torch.float32)
    return torch.cat([*parts, trailing]).to(q.dtype)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gaps: torch.Tensor | None,
    *,
    max_len: int,
    position_bias: torch.Tensor,
    time_bias: torch.Tensor | None,
) -> torch.Tensor:
    """(n, H, E) fp32 outputs of one sequence of n tokens; `gaps` (n, n) query time - key time, or None."""
    n = q.shape[0]
    position = torch.arange(n, device=q.device)
    distance = position[:, None] - position[None, :]  # (n, n), query - key
    bias = position_bias[:, distance.clamp(0, max_len - 1)]  # (H, n, n)
    if time_bias is not None:
        assert gaps is not None
        bias = bias + time_bias[:, time_buckets(gaps, time_bias.shape[1])]
    scores = torch.einsum("ihe,jhe->hij", q, k) + bias  # (H, n, n)
    weights = F.silu(scores) * (distance >= 0) / max_len
    return torch.einsum("hij,jhe->ihe", weights, v)
