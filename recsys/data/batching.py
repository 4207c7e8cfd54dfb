"""Packed next-item training batches: compute follows real sequence lengths, not the padded maximum.

Each user's training sequence s gives inputs s[:-1] and targets s[1:] (the model is trained on every
position). The (input, target) runs of randomly ordered users are packed back to back into rows of
`max_len` tokens; a segment id per token keeps attention inside each user's run, and positions restart
per run. On Amazon Beauty (mean training run ~6 items, cap 50) this gives ~2,900 rows of 50 tokens per
epoch instead of 22,363 left-padded rows of 50, and every batch holds about the same number of targets,
so every target weighs the same in the loss whatever the length of its user's history.

Layout of one row (max_len = 8, two users a and b, 0 = padding)::

    inputs    a1 a2 a3 b1 b2  0  0  0
    targets   a2 a3 a4 b2 b3  0  0  0
    segments   1  1  1  2  2  0  0  0
    positions  5  6  7  6  7  0  0  0     # counted back from each run's most recent item
    timestamps      ta1 ta2 ta3 tb1 tb2 0 0 0   # the time of every input  } only when timestamps
    next_timestamps ta2 ta3 ta4 tb2 tb3 0 0 0   # the time of every target } are given
    target_index    ja2 ja3 ja4 jb2 jb3 0 0 0   # where every target is in `sequences.values` (index_targets)

Dimension letters: B rows in a batch, L = max_len.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from recsys.data.jagged import Jagged


@dataclass(frozen=True)
class PackedBatch:
    inputs: torch.Tensor  # (B, L) item_idx, 0 = padding
    targets: torch.Tensor  # (B, L) the next item of every input, 0 = no target
    segments: torch.Tensor  # (B, L) run id within the row, 1.. ; 0 = padding
    positions: torch.Tensor  # (B, L) position ids in [0, max_len)
    timestamps: torch.Tensor | None = None  # (B, L) time of every input, 0 = padding; None = not packed
    next_timestamps: torch.Tensor | None = None  # (B, L) time of every target (the moment each position predicts for)
    # (B, L) the index of every target in the packed `sequences.values` (a target is never a row's first value, so 0
    # is padding): what per-target data computed once for the rows (a teacher's scores) is looked up by; None = not
    # packed
    target_index: torch.Tensor | None = None
    # (N,) the flat (B * L) index of every real target, found by `to` on the host: a device that indexes by it never
    # stops the host to learn N (a boolean mask's `nonzero` would); None = not moved, found from `targets` then
    real_positions: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> PackedBatch:
        pin = torch.device(device).type == "cuda"

        def move(t: torch.Tensor) -> torch.Tensor:
            # from pinned memory the copy is queued behind the GPU's work; from pageable memory the host would wait
            # for that work to finish first (the previous step's all-reduce and update, with several processes);
            # a view whose elements share memory (an `expand`) cannot be pinned, so it is laid out first
            return (t.contiguous().pin_memory() if pin and t.device.type == "cpu" else t).to(device, non_blocking=True)

        return PackedBatch(
            move(self.inputs),
            move(self.targets),
            move(self.segments),
            move(self.positions),
            None if self.timestamps is None else move(self.timestamps),
            None if self.next_timestamps is None else move(self.next_timestamps),
            None if self.target_index is None else move(self.target_index),
            move(self.flat_real_positions()),
        )

    def take_rows(self, rows: slice) -> PackedBatch:
        """The batch of `rows` of this one (its real positions found again from their targets)."""
        sliced = {f.name: value[rows] for f in dataclasses.fields(self)
                  if f.name != "real_positions" and (value := getattr(self, f.name)) is not None}  # fmt: skip
        return dataclasses.replace(self, **sliced, real_positions=None)

    def flat_real_positions(self) -> torch.Tensor:
        """(N,) the flat (B * L) index of every real target (where `targets` is not 0), in order."""
        if self.real_positions is not None:
            return self.real_positions
        return torch.nonzero(self.targets.reshape(-1)).squeeze(1)


def packed_next_item_batches(
    sequences: Jagged,
    max_len: int,
    rows_per_batch: int,
    generator: torch.Generator,
    timestamps: Jagged | None = None,
    index_targets: bool = False,
) -> Iterator[PackedBatch]:
    """One epoch of shuffled, packed batches.

    Args:
        sequences: (U,) training sequences; rows with fewer than 2 items have no target and are skipped.
        max_len: row width; a user's run is cut to its most recent `max_len` (input, target) pairs.
        rows_per_batch: rows per batch (about rows_per_batch * max_len * fill targets each).
        generator: seeds the user order (deterministic epochs).
        timestamps: (U,) rows aligned with `sequences`, packed beside the inputs for time-aware models; or None.
        index_targets: pack every target's index in `sequences.values` (`PackedBatch.target_index`).
    """
    usable = torch.nonzero(sequences.lengths() >= 2).squeeze(1)
    order = usable[torch.randperm(len(usable), generator=generator)]
    runs = sequences.select(order)
    run_len = (runs.lengths() - 1).clamp(max=max_len)  # (U,) input tokens per run
    row, col = _next_fit(run_len, max_len)  # where every run starts
    num_rows = int(row[-1]) + 1 if len(row) else 0
    # Scatter every token of every run into its row: run r, token k -> (row[r], col[r] + k).
    run_of_token = torch.repeat_interleave(torch.arange(len(run_len)), run_len)
    k = torch.arange(int(run_len.sum())) - torch.repeat_interleave(torch.cumsum(run_len, 0) - run_len, run_len)
    src = runs.offsets[1:][run_of_token] - 1 - run_len[run_of_token] + k  # index of the input in runs.values
    rows, cols = row[run_of_token], col[run_of_token] + k
    shape = (num_rows, max_len)
    inputs, targets = torch.zeros(shape, dtype=torch.int64), torch.zeros(shape, dtype=torch.int64)
    segments, positions = torch.zeros(shape, dtype=torch.int64), torch.zeros(shape, dtype=torch.int64)
    inputs[rows, cols] = runs.values[src]
    targets[rows, cols] = runs.values[src + 1]
    segments[rows, cols] = _segment_numbers(row)[run_of_token]
    positions[rows, cols] = max_len - run_len[run_of_token] + k
    times = next_times = None
    if timestamps is not None:
        times, next_times = torch.zeros(shape, dtype=torch.int64), torch.zeros(shape, dtype=torch.int64)
        run_times = timestamps.select(order).values
        times[rows, cols], next_times[rows, cols] = run_times[src], run_times[src + 1]
    target_index = None
    if index_targets:  # the target's place in its run, from where the run's user starts in `sequences`
        target_index = torch.zeros(shape, dtype=torch.int64)
        run_start = runs.offsets[:-1][run_of_token]
        target_index[rows, cols] = sequences.offsets[:-1][order][run_of_token] + src + 1 - run_start
    for chunk in torch.split(torch.randperm(num_rows, generator=generator), rows_per_batch):
        yield PackedBatch(
            inputs[chunk],
            targets[chunk],
            segments[chunk],
            positions[chunk],
            None if times is None else times[chunk],
            None if next_times is None else next_times[chunk],
            None if target_index is None else target_index[chunk],
        )


def _next_fit(lengths: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and starting column of every run when runs are laid out in order, a new row when one is full."""
    rows, cols = [], []  # plain lists: item assignment into tensors costs ~20x more per run
    row, col = 0, 0
    for n in lengths.tolist():
        if col + n > capacity:
            row, col = row + 1, 0
        rows.append(row)
        cols.append(col)
        col += n
    return torch.tensor(rows, dtype=lengths.dtype), torch.tensor(cols, dtype=lengths.dtype)


def _segment_numbers(row: torch.Tensor) -> torch.Tensor:
    """1-based index of every run within its row (rows are non-decreasing)."""
    starts = torch.ones_like(row, dtype=torch.bool)
    starts[1:] = row[1:] != row[:-1]
    index = torch.arange(len(row))
    first_of_row = torch.cummax(torch.where(starts, index, 0), dim=0).values
    return index - first_of_row + 1


@dataclass(frozen=True)
class HistoryBatch:
    histories: torch.Tensor  # (B, H) left-padded item_idx before the target
    targets: torch.Tensor  # (B,) the next item
    users: torch.Tensor  # (B,) user_idx of the sequence (row + 1)
    labels: torch.Tensor | None = None  # (B, T) the targets' task labels (NaN = unknown); None = no tasks asked

    def to(self, device: torch.device | str) -> HistoryBatch:
        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        labels = None if self.labels is None else move(self.labels)
        return HistoryBatch(move(self.histories), move(self.targets), move(self.users), labels)


def history_target_batches(
    sequences: Jagged,
    max_history: int,
    batch_size: int,
    generator: torch.Generator,
    labels: Sequence[Jagged] = (),
    by_length: bool = False,
    widths: Sequence[int] = (),
) -> Iterator[HistoryBatch]:
    """One epoch of shuffled (history, next item) pairs: every item after the first of every sequence.

    For models that read a history and emit one item (encoder-decoder), each pair is its own example.

    Args:
        sequences: (U,) training sequences.
        max_history: H, the most recent items kept before each target.
        batch_size: pairs per batch.
        generator: seeds the shuffling.
        labels: T task label rows aligned with `sequences`: each pair carries its target's (`HistoryBatch.labels`).
        by_length: batch pairs of equal history length together (which pairs share a batch is random within a
            length, the batches' order is shuffled), each batch as wide as its histories: compute follows the real
            lengths, not H (Beauty: 6.7 items on average where H = 20). Otherwise every batch is H wide.
        widths: with `by_length`, the batch widths allowed (rising): each batch is left-padded to the narrowest that
            holds its histories (H when none does), so a compiled model sees a few shapes instead of one per length;
            () = every batch exactly as wide as its longest history.

    Example:
        >>> batch = next(history_target_batches(Jagged.from_lists([[4, 5, 6]]), 2, 8, torch.Generator()))
        >>> sorted(zip(batch.histories.tolist(), batch.targets.tolist()))
        [([0, 4], 5), ([4, 5], 6)]
        >>> [b.histories.tolist() for b in history_target_batches(
        ...     Jagged.from_lists([[4, 5, 6]]), 2, 1, torch.Generator().manual_seed(0), by_length=True)]
        [[[4, 5]], [[4]]]
        >>> [b.histories.tolist() for b in history_target_batches(
        ...     Jagged.from_lists([[4, 5, 6]]), 2, 1, torch.Generator().manual_seed(0), by_length=True, widths=[2])]
        [[[4, 5]], [[0, 4]]]
    """
    lengths = sequences.lengths()
    starts = torch.repeat_interleave(sequences.offsets[:-1], lengths)  # (N,) row start of every value
    position = torch.arange(len(sequences.values)) - starts  # index of every value inside its row
    targets = torch.nonzero(position >= 1).squeeze(1)  # values that have at least one item before them
    back = torch.arange(max_history, 0, -1)  # (H,) how far back each history column looks
    source = targets[:, None] - back[None, :]  # (N, H)
    valid = position[targets][:, None] >= back[None, :]
    histories = torch.where(valid, sequences.values[source.clamp(min=0)], 0)
    users = torch.repeat_interleave(torch.arange(1, len(sequences) + 1), lengths)[targets]  # (N,) row + 1
    target_labels = _stacked([rows.values[targets] for rows in labels])
    order = torch.randperm(len(targets), generator=generator)
    lengths_of = position[targets].clamp(max=max_history)  # (N,) each pair's history length
    if by_length:
        order = order[torch.sort(lengths_of[order], stable=True).indices]  # by length, still shuffled within one
        chunks = list(torch.split(order, batch_size))
        chunks = [chunks[i] for i in torch.randperm(len(chunks), generator=generator).tolist()]
    else:
        chunks = list(torch.split(order, batch_size))
    allowed = torch.tensor([*sorted(w for w in widths if w < max_history), max_history])
    for chunk in chunks:
        chunk_labels = None if target_labels is None else target_labels[chunk]
        width = int(lengths_of[chunk].max()) if by_length else max_history
        if widths:  # the narrowest allowed width that holds the chunk's histories
            width = int(allowed[int(torch.searchsorted(allowed, width))])
        yield HistoryBatch(
            histories[chunk, max_history - width :], sequences.values[targets[chunk]], users[chunk], chunk_labels
        )


def held_out_batches(
    sequences: Jagged,
    held_out: int,
    max_history: int,
    batch_size: int,
    generator: torch.Generator,
    labels: Sequence[Jagged] = (),
) -> Iterator[HistoryBatch]:
    """One epoch of shuffled (history, item) pairs for each of every sequence's last `held_out` items (each with
    at least one item before it).

    These are the items a first stage trained with `holdout_last: held_out` never saw, so a second stage learns on
    candidates like those it gets at serving time. `labels` are as in `history_target_batches`.

    Example:
        >>> batch = next(held_out_batches(Jagged.from_lists([[4, 5, 6], [7]]), 2, 2, 8, torch.Generator()))
        >>> sorted(zip(batch.histories.tolist(), batch.targets.tolist(), batch.users.tolist()))
        [([0, 4], 5, 1), ([4, 5], 6, 1)]
    """
    histories, targets, users, target_labels = [], [], [], []
    for back in range(1, held_out + 1):  # the item `back` places from the end, after its own history
        usable = torch.nonzero(sequences.lengths() >= back + 1).squeeze(1)
        rows = sequences.select(usable)
        histories.append(rows.truncate_last(back).to_padded(max_history))
        targets.append(rows.last(back))
        users.append(usable + 1)
        target_labels.append(_stacked([task.select(usable).last(back) for task in labels]))
    history, target, user = torch.cat(histories), torch.cat(targets), torch.cat(users)
    label = None if not labels else torch.cat(target_labels)  # type: ignore[arg-type]
    for chunk in torch.split(torch.randperm(len(target), generator=generator), batch_size):
        yield HistoryBatch(history[chunk], target[chunk], user[chunk], None if label is None else label[chunk])


def _stacked(columns: list[torch.Tensor]) -> torch.Tensor | None:
    """T (N,) label columns -> (N, T) float, or None without any."""
    return torch.stack(columns, dim=1).float() if columns else None
