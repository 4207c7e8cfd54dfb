"""Metrics on subsets of users (slices), computed from the per-user ranks of one evaluation.

A slice family splits the users of an evaluation split by a property of the user or of their target item;
each function below returns the family's masks, `slice_report` turns families into per-slice metrics.
The families of the offline evaluation dashboard (docs/pipelines.md):

    cold_start          the target item was never seen in training ("cold") or was ("warm")
    popularity_decile   decile "1" (least popular) .. "10" (most popular) of the target item, by training count
    history_length      the length of the history the model reads: "1-2", "3-5", "6-10", "11-20", "21+"
    domain              the target item's domain (data with a domain column only)

Dimension letters: U users of the split, V items (index 0 of per-item tensors is the padding item).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from recsys.data.prepared import EvalSplit, SequenceData
from recsys.data.schema import DOMAIN
from recsys.evaluation.metrics import ranking_metrics
from recsys.evaluation.uncertainty import Uncertainty, metric_intervals

SliceMasks = dict[str, torch.Tensor]  # slice name -> (U,) bool, in display order

# (lowest, highest) history length of each bucket; None = no upper bound
HISTORY_BUCKETS: tuple[tuple[int, int | None], ...] = ((1, 2), (3, 5), (6, 10), (11, 20), (21, None))
NUM_DECILES = 10


def slice_metrics(ranks: torch.Tensor, members: torch.Tensor, ks: tuple[int, ...]) -> dict[str, float]:
    """Ranking metrics over the users where `members` (bool, aligned with `ranks`) is True.

    Returns {"users": n, ...metrics}; metrics are NaN-free: an empty slice gives {"users": 0}.

    Example:
        >>> slice_metrics(torch.tensor([0, 7, 1]), torch.tensor([True, False, True]), ks=(1,))["recall@1"]
        0.5
    """
    count = int(members.sum())
    if count == 0:
        return {"users": 0}
    return {"users": count, **ranking_metrics(ranks[members], ks)}


def cold_start_masks(targets: torch.Tensor, item_counts: torch.Tensor) -> SliceMasks:
    """Users whose target item occurs in the training sequences ("warm") and those whose target does not ("cold").

    Args:
        targets: (U,) item_idx of each user's target.
        item_counts: (V+1,) training interactions per item (`SequenceData.item_counts()`); held-out
            cold-start items have 0, so they are "cold" here too.

    Example:
        >>> masks = cold_start_masks(torch.tensor([1, 2, 2]), torch.tensor([0, 4, 0]))
        >>> {name: mask.tolist() for name, mask in masks.items()}
        {'warm': [True, False, False], 'cold': [False, True, True]}
    """
    seen = item_counts[targets] > 0
    return {"warm": seen, "cold": ~seen}


def popularity_deciles(item_counts: torch.Tensor) -> torch.Tensor:
    """(V+1,) the popularity decile 1..10 of every item (0 for the padding item).

    An item's decile is 1 + floor(10 * b / V), where b is the number of items with a smaller training count:
    items are ranked by count, the catalog is cut into ten equal shares, and tied items share the decile of
    the first of them (so with many never-seen items, decile 1 holds them all and the next ones may be empty).
    The most popular item is always in decile 10 unless more than a tenth of the catalog ties with it.

    Example:
        >>> popularity_deciles(torch.tensor([0, 5, 0, 1, 9])).tolist()
        [0, 6, 1, 3, 8]
    """
    counts = item_counts[1:]  # (V,)
    num_items = len(counts)
    below = torch.searchsorted(torch.sort(counts).values, counts, side="left")  # (V,) items with a smaller count
    deciles = 1 + (NUM_DECILES * below) // max(num_items, 1)
    return torch.cat([torch.zeros(1, dtype=torch.int64), deciles.long()])


def popularity_decile_masks(targets: torch.Tensor, item_counts: torch.Tensor) -> SliceMasks:
    """Users by the popularity decile of their target item: "1" (least popular) .. "10" (most popular).

    Example:
        >>> masks = popularity_decile_masks(torch.tensor([4, 2]), torch.tensor([0, 5, 0, 1, 9]))
        >>> [name for name, mask in masks.items() if mask.any()]
        ['1', '8']
    """
    decile = popularity_deciles(item_counts)[targets]  # (U,)
    return {str(d): decile == d for d in range(1, NUM_DECILES + 1)}


def history_length_masks(
    lengths: torch.Tensor, buckets: Sequence[tuple[int, int | None]] = HISTORY_BUCKETS
) -> SliceMasks:
    """Users by the length of the history the model reads, in `buckets` ("1-2", ..., "21+").

    Users below the first bucket (an empty history: every earlier item was a held-out cold item) get a
    bucket "0" of their own, present only when there are any.

    Args:
        lengths: (U,) history lengths (`EvalSplit.histories.lengths()`).
        buckets: (lowest, highest or None) per bucket, increasing.

    Example:
        >>> masks = history_length_masks(torch.tensor([1, 4, 30, 2]))
        >>> {name: int(mask.sum()) for name, mask in masks.items()}
        {'1-2': 2, '3-5': 1, '6-10': 0, '11-20': 0, '21+': 1}
    """
    masks: SliceMasks = {}
    lowest = buckets[0][0]
    if bool((lengths < lowest).any()):
        masks["0" if lowest == 1 else f"0-{lowest - 1}"] = lengths < lowest
    for low, high in buckets:
        name = f"{low}+" if high is None else f"{low}-{high}"
        masks[name] = (lengths >= low) if high is None else (lengths >= low) & (lengths <= high)
    return masks


def domain_masks(targets: torch.Tensor, item_domains: Sequence[str | None]) -> SliceMasks:
    """Users by the domain of their target item, domains in alphabetical order ("unknown" for a missing one).

    Args:
        targets: (U,) item_idx of each user's target.
        item_domains: (V+1,) the domain of every item, indexed by item_idx (entry 0, the padding, is ignored).

    Example:
        >>> masks = domain_masks(torch.tensor([1, 2, 1]), [None, "home", "beauty"])
        >>> {name: mask.tolist() for name, mask in masks.items()}
        {'beauty': [False, True, False], 'home': [True, False, True]}
    """
    names = sorted({d if d else "unknown" for d in item_domains[1:]})
    code_of = {name: code for code, name in enumerate(names)}
    codes = torch.tensor([-1] + [code_of[d if d else "unknown"] for d in item_domains[1:]], dtype=torch.int64)
    target_codes = codes[targets]  # (U,)
    return {name: target_codes == code for name, code in code_of.items()}


def slice_report(
    ranks: torch.Tensor,
    families: Mapping[str, SliceMasks],
    ks: tuple[int, ...],
    uncertainty: Uncertainty | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Per family, one entry per slice: {"name", "users", recall@k, ndcg@k, mrr} (metrics absent when empty), and
    with `uncertainty` on, "intervals": {metric: [low, high]} over the slice's users.

    Args:
        ranks: (U,) 0-based rank of each user's target (`EvalResult.ranks`).
        families: family name -> its masks, each (U,) bool aligned with `ranks`.
        ks: the cut-offs.
        uncertainty: how the intervals are made (None or 0 resamples: no intervals).

    Example:
        >>> report = slice_report(torch.tensor([0, 5]), {"f": {"a": torch.tensor([True, False])}}, ks=(1,))
        >>> report["f"][0]["name"], report["f"][0]["users"], report["f"][0]["recall@1"]
        ('a', 1, 1.0)
    """
    report: dict[str, list[dict[str, Any]]] = {}
    for family, masks in families.items():
        report[family] = []
        for name, members in masks.items():
            entry = {"name": name, **slice_metrics(ranks, members, ks)}
            if uncertainty is not None and uncertainty.resamples and entry["users"]:
                entry["intervals"] = metric_intervals(ranks[members], ks, uncertainty)
            report[family].append(entry)
    return report


def slice_codes(masks: SliceMasks) -> torch.Tensor:
    """(U,) int16: the index of each user's slice in `masks` (display order), -1 for a user in none; the slices of
    a family are disjoint (a user in two is an error).

    Example:
        >>> slice_codes({"a": torch.tensor([True, False, False]), "b": torch.tensor([False, True, False])}).tolist()
        [0, 1, -1]
    """
    stacked = torch.stack(list(masks.values()))  # (S, U)
    if bool((stacked.sum(dim=0) > 1).any()):
        raise ValueError(f"slices {list(masks)} overlap: a user is in two. Fix: make the family's masks disjoint")
    codes = torch.full((stacked.shape[1],), -1, dtype=torch.int16)
    for index, members in enumerate(stacked):
        codes[members] = index
    return codes


def flat_slice_metrics(report: Mapping[str, list[dict[str, Any]]], prefix: str = "slice.") -> dict[str, float]:
    """{"slice.<family>_<name>.<metric>": value} for every metric and user count of a `slice_report`.

    Example:
        >>> flat_slice_metrics({"popularity_decile": [{"name": "3", "users": 2, "ndcg@10": 0.5}]})
        {'slice.popularity_decile_3.users': 2.0, 'slice.popularity_decile_3.ndcg@10': 0.5}
    """
    return {
        f"{prefix}{family}_{entry['name']}.{metric}": float(value)
        for family, entries in report.items()
        for entry in entries
        for metric, value in entry.items()
        if metric not in ("name", "intervals")
    }


def slice_families(data: SequenceData, split: EvalSplit) -> dict[str, SliceMasks]:
    """The slice families of `split`: popularity and cold start from the training counts, the domain when known."""
    counts = data.item_counts()  # (V+1,) training interactions per item
    families = {
        "cold_start": cold_start_masks(split.targets, counts),
        "popularity_decile": popularity_decile_masks(split.targets, counts),
        "history_length": history_length_masks(split.histories.lengths()),
    }
    if data.domains:
        families["domain"] = domain_masks(split.targets, [None, *data.items[DOMAIN].to_list()])
    return families
