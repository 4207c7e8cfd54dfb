from __future__ import annotations

import pytest
import torch

from recsys.data.batching import HistoryBatch, PackedBatch, history_target_batches, packed_next_item_batches
from recsys.data.jagged import Jagged

ROWS = [[1, 2, 3, 4], [5], [6, 7], [8, 9, 10, 11, 12, 13], [14, 15, 16]]


def epoch(max_len: int, rows_per_batch: int, seed: int = 0) -> list[PackedBatch]:
    gen = torch.Generator().manual_seed(seed)
    return list(packed_next_item_batches(Jagged.from_lists(ROWS), max_len, rows_per_batch, gen))


def runs_of(batches: list[PackedBatch]) -> list[list[tuple[int, int, int]]]:
    """(input, target, position) triples grouped by (row, segment)."""
    runs = []
    for b in batches:
        for r in range(b.inputs.shape[0]):
            for seg in b.segments[r].unique().tolist():
                if seg == 0:
                    continue
                sel = b.segments[r] == seg
                runs.append(list(zip(*(t[r][sel].tolist() for t in (b.inputs, b.targets, b.positions)), strict=True)))
    return runs


def test_every_next_item_pair_appears_once_with_its_run() -> None:
    runs = runs_of(epoch(max_len=6, rows_per_batch=2))
    pairs = sorted((i, t) for run in runs for i, t, _ in run)
    assert pairs == sorted((r[i], r[i + 1]) for r in ROWS for i in range(len(r) - 1))
    assert sorted(len(run) for run in runs) == [1, 2, 3, 5]  # the one-item user has no target


def test_runs_are_cut_to_max_len_and_positions_count_back_from_the_end() -> None:
    runs = runs_of(epoch(max_len=3, rows_per_batch=4))
    longest = next(run for run in runs if (12, 13, 2) in run)
    assert longest == [(10, 11, 0), (11, 12, 1), (12, 13, 2)]  # the most recent pairs are kept
    short = next(run for run in runs if run[0][0] == 6)
    assert short == [(6, 7, 2)]


def test_timestamps_are_packed_beside_their_inputs_and_targets() -> None:
    gen = torch.Generator().manual_seed(0)
    times = Jagged.from_lists([[1000 * v for v in row] for row in ROWS])  # every item's time names the item
    batches = list(packed_next_item_batches(Jagged.from_lists(ROWS), 4, 2, gen, timestamps=times))
    for b in batches:
        assert b.timestamps is not None and b.next_timestamps is not None
        torch.testing.assert_close(b.timestamps, 1000 * b.inputs)  # padding: 0 and 0
        torch.testing.assert_close(b.next_timestamps, 1000 * b.targets)
    assert epoch(4, 2)[0].timestamps is None  # not asked for: not packed


def test_padding_has_no_target_and_no_segment() -> None:
    for b in epoch(max_len=8, rows_per_batch=1):
        pad = b.segments == 0
        assert (b.inputs[pad] == 0).all() and (b.targets[pad] == 0).all()
        assert (b.targets[~pad] != 0).all()


def test_epochs_are_deterministic_by_seed_and_shuffled() -> None:
    def layout(seed: int) -> list[list[list[int]]]:
        return [b.inputs.tolist() for b in epoch(8, 1, seed=seed)]

    assert layout(3) == layout(3)
    assert len({str(layout(s)) for s in range(6)}) > 1


def pairs(batches: list[HistoryBatch]) -> list[tuple[tuple[int, ...], int, int]]:
    """(history without padding, target, user) of every pair."""
    out = []
    for b in batches:
        for history, target, user in zip(b.histories.tolist(), b.targets.tolist(), b.users.tolist(), strict=True):
            out.append((tuple(item for item in history if item), target, user))
    return sorted(out)


def test_pairs_batched_by_length_are_the_same_pairs_each_batch_as_wide_as_its_histories() -> None:
    rows, max_history = Jagged.from_lists(ROWS), 3
    shuffled = list(history_target_batches(rows, max_history, 2, torch.Generator().manual_seed(0)))
    by_length = list(history_target_batches(rows, max_history, 2, torch.Generator().manual_seed(0), by_length=True))
    assert pairs(by_length) == pairs(shuffled) and len(pairs(shuffled)) == sum(len(r) - 1 for r in ROWS)
    assert all(b.histories.shape[1] == max_history for b in shuffled)
    for b in by_length:
        lengths = (b.histories > 0).sum(dim=1)
        assert b.histories.shape[1] == int(lengths.max()) <= max_history  # no column of padding only
        assert int(lengths.max()) - int(lengths.min()) <= 1  # sorted by length: a batch spans one length or two
    other = list(history_target_batches(rows, max_history, 2, torch.Generator().manual_seed(1), by_length=True))
    assert [b.targets.tolist() for b in other] != [b.targets.tolist() for b in by_length]  # shuffled by the seed


def test_pairs_by_length_in_width_buckets_are_the_same_batches_left_padded_to_the_narrowest_bucket() -> None:
    rows, max_history = Jagged.from_lists(ROWS), 5
    exact = list(history_target_batches(rows, max_history, 2, torch.Generator().manual_seed(0), by_length=True))
    bucketed = list(history_target_batches(rows, max_history, 2, torch.Generator().manual_seed(0), by_length=True,
                                           widths=[2, 4]))  # fmt: skip
    assert len(bucketed) == len(exact)
    for narrow, padded in zip(exact, bucketed, strict=True):  # the same pairs in the same order
        assert torch.equal(padded.targets, narrow.targets) and torch.equal(padded.users, narrow.users)
        width = narrow.histories.shape[1]
        assert padded.histories.shape[1] == min(w for w in (2, 4, max_history) if w >= width)
        assert torch.equal(padded.histories[:, -width:], narrow.histories)  # only padding added, on the left
        assert not padded.histories[:, :-width].any()
    assert {b.histories.shape[1] for b in bucketed} <= {2, 4, max_history}
    assert len({b.histories.shape[1] for b in exact}) > len({b.histories.shape[1] for b in bucketed})


def test_a_moved_batch_knows_its_real_targets_flat_positions_and_a_row_slice_finds_them_again() -> None:
    sequences = Jagged.from_lists([[1, 2, 3], [4, 5], [6, 7, 8, 9], [3, 1]])
    (batch,) = packed_next_item_batches(sequences, 3, 8, torch.Generator().manual_seed(0))
    moved = batch.to("cpu")  # found on the host, whatever the device: the device never reports N back
    expected = torch.nonzero(batch.targets.reshape(-1) != 0).squeeze(1)
    assert batch.real_positions is None and torch.equal(moved.flat_real_positions(), expected)
    assert torch.equal(moved.targets.reshape(-1)[moved.flat_real_positions()], batch.targets[batch.targets != 0])
    half = moved.take_rows(slice(1, None, 2))
    assert torch.equal(half.targets, batch.targets[1::2]) and half.real_positions is None
    assert torch.equal(half.targets.reshape(-1)[half.flat_real_positions()], half.targets[half.targets != 0])


@pytest.mark.gpu
def test_a_batch_of_broadcast_views_moves_to_cuda_through_pinned_memory() -> None:
    if not torch.cuda.is_available():
        pytest.skip("pinned host memory needs a CUDA device")
    rows = torch.tensor([[0, 1, 2, 3]]).expand(2, -1)  # one row's memory seen twice: cannot be pinned as it is
    batch = PackedBatch(rows + 1, rows + 2, torch.ones(2, 4, dtype=torch.int64), rows)
    moved = batch.to("cuda")
    assert moved.positions.is_cuda and torch.equal(moved.positions.cpu(), rows)
