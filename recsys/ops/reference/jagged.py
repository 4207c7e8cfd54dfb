"""Ground truth for the jagged helpers: plain PyTorch, one row at a time, obviously right rather than fast.

Dimension letters: B rows (the batch), L the padded length, D the width of each value, N values (all rows).

Layout (the platform's `recsys.data.jagged.Jagged`, torchrec's `JaggedTensor`; B=3, L=2)::

    lengths  (B,)       [2, 0, 3]
    offsets  (B+1,)     [0, 2, 2, 5]           = complete_cumsum(lengths); row b = values[offsets[b]:offsets[b+1]]
    values   (N, D)     [v0 v1 | v2 v3 v4]
    dense    (B, L, D)  [[v0, v1], [p, p], [v2, v3]]   p = padding_value; v4 is cut off (row longer than L)

`padded_dense_to_jagged` goes back: value n of row b takes dense[b, n - offsets[b]] when that position is
< L, and 0 otherwise (fbgemm's `dense_to_jagged`: positions past L carry nothing, so they get 0).

No arithmetic happens here: values are copied in their own dtype, so every backend must match the
reference bit for bit (forward and gradients). Both conversions are differentiable through autograd
(slices and concatenations), and each one's gradient is the other conversion of the output gradient.
"""

from __future__ import annotations

import itertools

import torch


def complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    """(n+1,) int64 offsets [0, l0, l0+l1, ...] of (n,) integer lengths (fbgemm's asynchronous_complete_cumsum)."""
    sums = itertools.accumulate(lengths.tolist(), initial=0)
    return torch.tensor(list(sums), dtype=torch.int64, device=lengths.device)


def jagged_to_padded_dense(
    values: torch.Tensor, offsets: torch.Tensor, max_length: int, padding_value: float = 0.0
) -> torch.Tensor:
    """(B, L, D) dense rows: the first L values of each row, then `padding_value`.

    Args:
        values: (N, D) all rows concatenated.
        offsets: (B+1,) int row b = values[offsets[b]:offsets[b+1]].
        max_length: L; longer rows are truncated to their first L values.
        padding_value: fills positions past a row's end (rounded to the values' dtype).
    """
    dim = values.shape[1]
    dense_rows = []
    for b in range(offsets.numel() - 1):
        row = values[int(offsets[b]) : int(offsets[b + 1])][:max_length]  # (min(len, L), D)
        padding = values.new_full((max_length - row.shape[0], dim), padding_value)
        dense_rows.append(torch.cat([row, padding]))
    if not dense_rows:  # B = 0, still connected to `values` for autograd
        return values[:0, None].expand(0, max_length, dim)
    return torch.stack(dense_rows)


def padded_dense_to_jagged(dense: torch.Tensor, offsets: torch.Tensor, total_length: int | None = None) -> torch.Tensor:
    """(N, D) values of the jagged rows read from (B, L, D) dense rows; positions >= L get 0.

    Args:
        dense: (B, L, D).
        offsets: (B+1,) int, the rows' layout in the result (offsets[-1] = N).
        total_length: N, if known (the fast backends use it to avoid a device sync); checked here.
    """
    dim = dense.shape[2]
    parts = []
    for b in range(offsets.numel() - 1):
        length = int(offsets[b + 1]) - int(offsets[b])
        kept = dense[b, :length]  # (min(len, L), D)
        parts.append(torch.cat([kept, dense.new_zeros(length - kept.shape[0], dim)]))
    values = torch.cat(parts) if parts else dense.flatten(0, 1)[:0]  # B = 0: (0, D), connected to `dense`
    if total_length is not None and total_length != values.shape[0]:
        raise ValueError(f"total_length={total_length} but offsets[-1]={values.shape[0]}")
    return values
