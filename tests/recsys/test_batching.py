from __future__ import annotations

import torch

from recsys.data.batching import next_item_batches
from recsys.data.jagged import Jagged

ROWS = [[1, 2, 3, 4], [5], [6, 7], [8, 9, 10, 11, 12, 13], [14, 15, 16]]


def epoch(max_len: int, batch_size: int, seed: int = 0) -> list:
    return list(next_item_batches(Jagged.from_lists(ROWS), max_len, batch_size, torch.Generator().manual_seed(seed)))


def test_every_next_item_pair_appears_once_per_epoch() -> None:
    pairs = []
    for batch in epoch(max_len=50, batch_size=2):
        real = batch.targets != 0
        pairs += list(zip(batch.inputs[real].tolist(), batch.targets[real].tolist(), strict=True))
    expected = [(r[i], r[i + 1]) for r in ROWS for i in range(len(r) - 1)]
    assert sorted(pairs) == sorted(expected)


def test_batches_are_padded_to_their_own_longest_row_and_truncated_to_max_len() -> None:
    for batch in epoch(max_len=3, batch_size=1):
        row_len = int((batch.inputs != 0).sum())
        assert batch.inputs.shape[1] == row_len <= 3
    longest = next(b for b in epoch(max_len=3, batch_size=1) if 13 in b.targets.tolist()[0])
    assert longest.inputs.tolist() == [[10, 11, 12]]  # the most recent pairs are kept


def test_epochs_are_deterministic_by_seed_and_shuffled() -> None:
    first = [b.inputs.tolist() for b in epoch(50, 1, seed=3)]
    assert first == [b.inputs.tolist() for b in epoch(50, 1, seed=3)]
    orders = {tuple(map(str, (b.inputs.tolist() for b in epoch(50, 1, seed=s)))) for s in range(6)}
    assert len(orders) > 1
