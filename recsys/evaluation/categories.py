"""How right predicted category paths are against true ones (docs/enrich.md, "Category accuracy").

A category path is its levels from the top, e.g. "Beauty > Makeup > Nails > Nail Polish" is
["Beauty", "Makeup", "Nails", "Nail Polish"]. For every item, a predicted path (an LLM's answer) is scored against
the true one (Amazon's):

- `level_k`: the first k levels of the prediction are the true path's first k levels. Scored over the items whose
  true path has at least k levels; a prediction shorter than k is wrong at level k.
- `top_level` is `level_1`; `leaf`: the prediction is the whole true path (it names the item's own, deepest
  category, not a parent of it).
- `prefix`: the prediction is a prefix of the true path (right as far as it goes, however coarse).

Each figure is a mean over items of a 0/1 value, so its interval is the percentile bootstrap over items
(`recsys.evaluation.uncertainty.bootstrap_intervals`).

Dimension letters: N items.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from recsys.evaluation.uncertainty import Uncertainty, bootstrap_intervals

SEPARATOR = " > "  # Amazon's and the enrich prompt's: "Beauty > Skin Care"
CategoryPath = Sequence[str]  # its levels from the top


def split_path(text: str, separator: str = SEPARATOR) -> list[str]:
    """The levels of a category path written as text, each stripped; empty levels dropped.

    Example:
        >>> split_path("Beauty > Skin Care > Face ")
        ['Beauty', 'Skin Care', 'Face']
    """
    return [level.strip() for level in text.split(separator) if level.strip()]


@dataclass(frozen=True)
class Accuracy:
    """One figure: the share of `items` right, and its bootstrap interval ([] when intervals are off)."""

    value: float
    items: int
    interval: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return {"value": self.value, "items": self.items, "interval": self.interval}


def category_accuracy(
    predicted: Sequence[CategoryPath], true: Sequence[CategoryPath], uncertainty: Uncertainty | None = None
) -> dict[str, Accuracy]:
    """Top-level, leaf, prefix and per-level accuracy of `predicted` paths against `true` ones, item by item.

    Args:
        predicted, true: N paths each (lists of levels, `split_path`), the same items in the same order; a true path
            has at least one level.
        uncertainty: resamples, confidence and seed of the intervals (None or 0 resamples: no intervals).

    Returns:
        {"top_level", "leaf", "prefix", "level_1", ..., "level_D"} (D the deepest true path) -> `Accuracy`.

    Example:
        >>> scores = category_accuracy(
        ...     [["Beauty", "Skin Care"], ["Beauty", "Makeup"], ["Toys"]],
        ...     [["Beauty", "Skin Care", "Face"], ["Beauty", "Hair Care"], ["Beauty", "Makeup"]],
        ... )
        >>> {name: round(a.value, 3) for name, a in scores.items()}
        {'top_level': 0.667, 'leaf': 0.0, 'prefix': 0.333, 'level_1': 0.667, 'level_2': 0.333, 'level_3': 0.0}
        >>> scores["level_3"].items
        1
    """
    if len(predicted) != len(true):
        raise ValueError(
            f"{len(predicted)} predicted paths for {len(true)} true ones. Fix: pass one prediction per item, "
            "in the true paths' order"
        )
    if not true:
        raise ValueError("no items to score. Fix: pass at least one item's paths")
    if any(not path for path in true):
        raise ValueError("a true category path has no level. Fix: drop items without a true category")
    pairs = [(list(p), list(t)) for p, t in zip(predicted, true, strict=True)]
    hits: dict[str, list[float]] = {
        "leaf": [float(p == t) for p, t in pairs],
        "prefix": [float(bool(p) and t[: len(p)] == p) for p, t in pairs],
    }
    for level in range(1, max(len(t) for _, t in pairs) + 1):
        hits[f"level_{level}"] = [float(p[:level] == t[:level]) for p, t in pairs if len(t) >= level]
    hits = {"top_level": hits["level_1"], **hits}
    return {name: _accuracy(values, uncertainty) for name, values in hits.items()}


def distribution(paths: Sequence[CategoryPath], depth: int | None = None, top: int = 5) -> dict[str, object]:
    """How spread the paths are: the `top` commonest (cut to their first `depth` levels) with their shares, and
    how many distinct there are.

    Example:
        >>> distribution([["Beauty", "Skin Care"], ["Beauty", "Skin Care", "Face"], ["Toys"]], depth=2, top=1)
        {'items': 3, 'distinct': 2, 'most_common': [['Beauty > Skin Care', 0.6667]]}
    """
    counts = Counter(SEPARATOR.join(path[:depth]) for path in paths)
    total = sum(counts.values())
    most = [[name, round(count / total, 4)] for name, count in counts.most_common(top)]
    return {"items": total, "distinct": len(counts), "most_common": most}


def _accuracy(values: list[float], uncertainty: Uncertainty | None) -> Accuracy:
    hits = torch.tensor(values, dtype=torch.float64).unsqueeze(1)  # (N, 1)
    interval: list[float] = []
    if uncertainty is not None and uncertainty.resamples:
        interval = [round(x, 4) for x in bootstrap_intervals(hits, uncertainty).squeeze(0).tolist()]
    return Accuracy(round(float(hits.mean()), 4), len(values), interval)
