"""Length-bucketed next-item training batches.

Each user's training sequence s gives inputs s[:-1] and targets s[1:] (the model is trained on
every position). Sequences of similar length are batched together and padded only to the longest
in their batch, so compute follows real lengths instead of the padded maximum: on Amazon Beauty the
mean training length is ~6 while the cap is 50.

Dimension letters: B sequences in a batch, L the batch's own length (<= max_len).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from recsys.data.jagged import Jagged


@dataclass(frozen=True)
class NextItemBatch:
    inputs: torch.Tensor  # (B, L) left-padded item_idx
    targets: torch.Tensor  # (B, L) the next item for every input position, 0 where padded

    def to(self, device: torch.device | str) -> NextItemBatch:
        return NextItemBatch(self.inputs.to(device, non_blocking=True), self.targets.to(device, non_blocking=True))


def next_item_batches(
    sequences: Jagged, max_len: int, batch_size: int, generator: torch.Generator
) -> Iterator[NextItemBatch]:
    """One epoch of shuffled, length-bucketed batches.

    Args:
        sequences: (U,) training sequences; rows shorter than 2 items have no target and are skipped.
        max_len: the most recent `max_len` (input, target) pairs of each sequence are used.
        batch_size: sequences per batch.
        generator: seeds the shuffling (deterministic epochs).
    """
    usable = torch.nonzero(sequences.lengths() >= 2).squeeze(1)
    lengths = sequences.lengths()[usable].clamp(max=max_len + 1)
    # Sort by length with a random tie order, cut into batches, then shuffle the batch order.
    noise = torch.rand(len(usable), generator=generator)
    order = usable[torch.argsort(lengths.double() + noise)]
    chunks = list(torch.split(order, batch_size))
    for i in torch.randperm(len(chunks), generator=generator).tolist():
        rows = sequences.select(chunks[i])
        padded = rows.to_padded(max_len + 1)
        width = int(rows.lengths().clamp(max=max_len + 1).max())
        padded = padded[:, -width:]  # (B, L+1)
        yield NextItemBatch(inputs=padded[:, :-1], targets=padded[:, 1:] * (padded[:, :-1] != 0))
