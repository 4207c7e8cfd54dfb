"""Slice families against hand-computed cases, and their invariants over drawn inputs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recsys.evaluation.metrics import ranking_metrics
from recsys.evaluation.slices import (
    cold_start_masks,
    domain_masks,
    flat_slice_metrics,
    history_length_masks,
    popularity_decile_masks,
    popularity_deciles,
    slice_report,
)


def test_cold_targets_are_the_items_never_seen_in_training() -> None:
    counts = torch.tensor([0, 3, 0, 1])  # item 2 never occurs in training (e.g. a held-out cold item)
    masks = cold_start_masks(torch.tensor([2, 1, 3, 2]), counts)
    assert list(masks) == ["warm", "cold"]
    assert masks["cold"].tolist() == [True, False, False, True] and masks["warm"].tolist() == [False, True, True, False]


def test_popularity_deciles_of_a_hundred_distinct_counts() -> None:
    counts = torch.cat([torch.zeros(1, dtype=torch.int64), torch.randperm(100) + 1])  # items 1..100, counts 1..100
    deciles = popularity_deciles(counts)
    assert deciles[0] == 0  # the padding item
    for item in range(1, 101):  # count c -> decile ceil(c / 10): the ten least popular in 1, ..., the top ten in 10
        assert deciles[item] == (int(counts[item]) - 1) // 10 + 1


def test_tied_items_share_a_decile_and_the_most_popular_is_in_ten() -> None:
    counts = torch.tensor([0] + [0] * 30 + [1] * 60 + [50] * 10)  # 100 items: 30 unseen, 60 seen once, 10 popular
    deciles = popularity_deciles(counts)
    assert (
        set(deciles[1:31].tolist()) == {1}
        and set(deciles[31:91].tolist()) == {4}
        and set(deciles[91:].tolist()) == {10}
    )
    masks = popularity_decile_masks(torch.tensor([1, 40, 95, 99]), counts)
    assert list(masks) == [str(d) for d in range(1, 11)]
    assert {name: int(mask.sum()) for name, mask in masks.items() if mask.any()} == {"1": 1, "4": 1, "10": 2}


def test_history_length_buckets() -> None:
    masks = history_length_masks(torch.tensor([1, 2, 3, 5, 6, 10, 11, 20, 21, 400]))
    assert {name: mask.nonzero().flatten().tolist() for name, mask in masks.items()} == {
        "1-2": [0, 1], "3-5": [2, 3], "6-10": [4, 5], "11-20": [6, 7], "21+": [8, 9],
    }  # fmt: skip
    with_empty = history_length_masks(torch.tensor([0, 4]))  # every earlier item was a held-out cold item
    assert next(iter(with_empty)) == "0" and with_empty["0"].tolist() == [True, False]


def test_domains_of_the_targets() -> None:
    domains = [None, "sports", "beauty", None, "sports"]  # item_idx 0 is padding; item 3 has no domain
    masks = domain_masks(torch.tensor([4, 2, 3, 1]), domains)
    assert list(masks) == ["beauty", "sports", "unknown"]
    assert masks["sports"].tolist() == [True, False, False, True] and masks["unknown"].tolist() == [
        False,
        False,
        True,
        False,
    ]


def test_slice_report_equals_metrics_of_the_members_and_flattens_for_mlflow() -> None:
    ranks = torch.tensor([0, 3, 12, 1, 60])
    members = torch.tensor([True, False, True, True, False])
    report = slice_report(
        ranks, {"family": {"in": members, "out": ~members, "none": torch.zeros(5, dtype=torch.bool)}}, (1, 10)
    )
    entry = report["family"][0]
    assert entry["name"] == "in" and entry["users"] == 3
    for name, value in ranking_metrics(ranks[members], (1, 10)).items():
        assert entry[name] == pytest.approx(value)
    assert report["family"][2] == {"name": "none", "users": 0}  # an empty slice has no (NaN) metrics
    flat = flat_slice_metrics(report)
    assert flat["slice.family_in.users"] == 3.0 and flat["slice.family_out.recall@10"] == pytest.approx(0.5)
    assert "slice.family_none.users" in flat and not any(k.startswith("slice.family_none.recall") for k in flat)


@settings(max_examples=50, deadline=None)
@given(
    counts=st.lists(st.integers(0, 50), min_size=1, max_size=60),
    targets=st.lists(st.integers(1, 60), min_size=1, max_size=40),
    lengths=st.lists(st.integers(1, 100), min_size=1, max_size=40),
)
def test_families_partition_the_users(counts: list[int], targets: list[int], lengths: list[int]) -> None:
    item_counts = torch.tensor([0, *counts])
    target = torch.tensor([(t - 1) % len(counts) + 1 for t in targets])
    for masks in (
        cold_start_masks(target, item_counts),
        popularity_decile_masks(target, item_counts),
        domain_masks(target, [None, *("ab"[c % 2] for c in counts)]),
    ):
        assert torch.stack(list(masks.values())).sum(0).tolist() == [1] * len(target)  # each user in one slice
    assert torch.stack(list(history_length_masks(torch.tensor(lengths)).values())).sum(0).tolist() == [1] * len(lengths)
    deciles = popularity_deciles(item_counts)[1:]
    order = torch.argsort(item_counts[1:])
    assert bool((deciles[order].diff() >= 0).all())  # more training interactions -> never a lower decile
    assert int(deciles.min()) >= 1 and int(deciles.max()) <= 10
