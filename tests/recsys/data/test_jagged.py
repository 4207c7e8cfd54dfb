from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recsys.data.jagged import Jagged, lengths_to_offsets

rows_strategy = st.lists(st.lists(st.integers(1, 50), max_size=7), min_size=1, max_size=12)


def test_layout_matches_docstring() -> None:
    j = Jagged.from_lists([[5, 7], [], [3, 9, 2]])
    assert j.values.tolist() == [5, 7, 3, 9, 2]
    assert j.offsets.tolist() == [0, 2, 2, 5]
    assert j.row(2).tolist() == [3, 9, 2]


def test_offsets_must_match_values() -> None:
    try:
        Jagged(torch.tensor([1, 2]), torch.tensor([0, 3]))
    except ValueError as err:
        assert "offsets[-1]=3" in str(err)
    else:
        raise AssertionError("a mismatched offsets tensor was accepted")


@settings(max_examples=60, deadline=None)
@given(rows=rows_strategy, data=st.data())
def test_operations_match_python_lists(rows: list[list[int]], data: st.DataObject) -> None:
    j = Jagged.from_lists(rows)
    picked = data.draw(st.lists(st.integers(0, len(rows) - 1), max_size=8))
    n = data.draw(st.integers(0, 3))
    width = data.draw(st.integers(0, 8))

    assert [j.select(torch.tensor(picked, dtype=torch.long)).row(i).tolist() for i in range(len(picked))] == [
        rows[p] for p in picked
    ]
    truncated = j.truncate_last(n)
    assert [truncated.row(i).tolist() for i in range(len(rows))] == [r[: max(len(r) - n, 0)] for r in rows]
    expected_padded = [[0] * max(width - len(r), 0) + r[-width:] if width else [] for r in rows]
    assert j.to_padded(width).tolist() == expected_padded


def test_last_needs_long_enough_rows() -> None:
    j = Jagged.from_lists([[1, 2, 3], [4, 5]])
    assert j.last(2).tolist() == [2, 4]
    try:
        j.last(3)
    except ValueError as err:
        assert "at least 3" in str(err)
    else:
        raise AssertionError("last(3) accepted a row of 2 values")


def test_lengths_to_offsets_is_a_complete_cumsum() -> None:
    assert lengths_to_offsets(torch.tensor([2, 0, 3])).tolist() == [0, 2, 2, 5]
    assert lengths_to_offsets(torch.tensor([], dtype=torch.long)).tolist() == [0]
