"""The one jagged type of the platform: variable-length rows stored as values + offsets.

Layout (the same as torchrec's `JaggedTensor` for one key)::

    rows     = [[5, 7], [], [3, 9, 2]]
    values   = [5, 7, 3, 9, 2]          # (N,)   all rows concatenated
    offsets  = [0, 2, 2, 5]             # (B+1,) row b is values[offsets[b]:offsets[b+1]]

Used for user histories, semantic-ID tuples and multi-hot features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Jagged:
    """Variable-length rows as `values` (N,) and `offsets` (B+1,) int64.

    Example:
        >>> j = Jagged.from_lists([[5, 7], [], [3, 9, 2]])
        >>> j.lengths().tolist()
        [2, 0, 3]
        >>> j.to_padded(max_len=2).tolist()  # left padding keeps the most recent items
        [[5, 7], [0, 0], [9, 2]]
    """

    values: torch.Tensor
    offsets: torch.Tensor

    def __post_init__(self) -> None:
        if self.offsets.ndim != 1 or self.offsets.numel() == 0:
            raise ValueError(f"offsets must be a non-empty 1-d tensor, got shape {tuple(self.offsets.shape)}")
        if int(self.offsets[-1]) != self.values.shape[0]:
            raise ValueError(f"offsets[-1]={int(self.offsets[-1])} != len(values)={self.values.shape[0]}")

    @staticmethod
    def from_lists(rows: Sequence[Sequence[int]], dtype: torch.dtype = torch.int64) -> Jagged:
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.int64)
        values = torch.tensor([v for r in rows for v in r], dtype=dtype)
        return Jagged(values, lengths_to_offsets(lengths))

    @staticmethod
    def from_lengths(values: torch.Tensor, lengths: torch.Tensor) -> Jagged:
        return Jagged(values, lengths_to_offsets(lengths))

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    def row(self, b: int) -> torch.Tensor:
        return self.values[self.offsets[b] : self.offsets[b + 1]]

    def select(self, rows: torch.Tensor) -> Jagged:
        """The rows at the given indices, in that order (vectorised gather)."""
        lengths = self.lengths()[rows]
        starts = self.offsets[:-1][rows]
        new_offsets = lengths_to_offsets(lengths)
        # For every output value: the start of its source row + its position inside the row.
        row_of_value = torch.repeat_interleave(torch.arange(rows.numel()), lengths)
        pos_in_row = torch.arange(int(new_offsets[-1])) - new_offsets[:-1][row_of_value]
        return Jagged(self.values[starts[row_of_value] + pos_in_row], new_offsets)

    def truncate_last(self, n: int) -> Jagged:
        """Drop the last `n` values of every row (rows shorter than `n` become empty)."""
        lengths = (self.lengths() - n).clamp(min=0)
        keep = _positions_from_end(self.offsets) >= n
        return Jagged(self.values[keep], lengths_to_offsets(lengths))

    def last(self, n: int = 1) -> torch.Tensor:
        """The n-th value from the end of every row, shape (B,); every row must have >= n values."""
        if bool((self.lengths() < n).any()):
            raise ValueError(f"every row needs at least {n} values")
        return self.values[self.offsets[1:] - n]

    def to_padded(self, max_len: int | None = None, pad: int = 0) -> torch.Tensor:
        """Left-padded dense (B, L) keeping the most recent `max_len` values of each row."""
        lengths = self.lengths()
        width = int(lengths.max()) if max_len is None and len(self) else int(max_len or 0)
        out = torch.full((len(self), width), pad, dtype=self.values.dtype)
        from_end = _positions_from_end(self.offsets)
        keep = from_end < width
        rows = torch.repeat_interleave(torch.arange(len(self)), lengths)[keep]
        out[rows, width - 1 - from_end[keep]] = self.values[keep]
        return out


def lengths_to_offsets(lengths: torch.Tensor) -> torch.Tensor:
    """Complete cumulative sum: (B,) lengths -> (B+1,) offsets starting at 0."""
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths.to(torch.int64), dim=0, out=offsets[1:])
    return offsets


def _positions_from_end(offsets: torch.Tensor) -> torch.Tensor:
    """For every value, how many values of its row come after it (0 = the row's last value)."""
    lengths = offsets[1:] - offsets[:-1]
    ends = torch.repeat_interleave(offsets[1:], lengths)
    return ends - 1 - torch.arange(int(offsets[-1]))
