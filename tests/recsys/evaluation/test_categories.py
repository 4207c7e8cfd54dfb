"""Category accuracy: each level scored over the items deep enough for it, a leaf only when the whole path is right,
intervals that hold the figure, and inputs that cannot be scored refused by name."""

from __future__ import annotations

import pytest

from recsys.evaluation.categories import category_accuracy, distribution, split_path
from recsys.evaluation.uncertainty import Uncertainty

TRUE = [
    ["Beauty", "Makeup", "Nails", "Nail Polish"],
    ["Beauty", "Skin Care", "Face"],
    ["Beauty", "Hair Care"],
    ["Beauty", "Skin Care", "Body", "Moisturizers"],
]


def test_each_level_counts_only_the_items_whose_true_path_reaches_it() -> None:
    predicted = [
        ["Beauty", "Nail Care"],  # right at level 1 only
        ["Beauty", "Skin Care", "Face"],  # the whole path: a leaf
        ["Beauty", "Hair Care", "Shampoo"],  # deeper than the truth: right at levels 1-2, not a leaf, not a prefix
        [],  # no answer: wrong everywhere
    ]
    scores = category_accuracy(predicted, TRUE)
    values = {name: (a.value, a.items) for name, a in scores.items()}
    assert values == {
        "top_level": (0.75, 4),
        "leaf": (0.25, 4),
        "prefix": (0.25, 4),
        "level_1": (0.75, 4),
        "level_2": (0.5, 4),
        "level_3": (0.3333, 3),
        "level_4": (0.0, 2),
    }
    assert all(a.interval == [] for a in scores.values())


def test_a_coarse_but_right_prediction_is_a_prefix_not_a_leaf() -> None:
    true = [["Beauty", "Skin Care", "Face"], ["Beauty", "Skin Care"]]
    scores = category_accuracy([["Beauty", "Skin Care"]] * 2, true)
    assert (scores["prefix"].value, scores["leaf"].value, scores["level_2"].value) == (1.0, 0.5, 1.0)


def test_intervals_are_seeded_and_hold_the_figure() -> None:
    predicted = [["Beauty", "Skin Care"]] * 40
    true = [["Beauty", "Skin Care"]] * 25 + [["Beauty", "Makeup"]] * 15
    uncertainty = Uncertainty(resamples=300, seed=3)
    level = category_accuracy(predicted, true, uncertainty)["level_2"]
    low, high = level.interval
    assert low < level.value == 0.625 < high
    assert category_accuracy(predicted, true, uncertainty)["level_2"].interval == [low, high]
    assert category_accuracy(predicted, true, Uncertainty(resamples=0))["level_2"].interval == []


def test_paths_that_cannot_be_scored_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"1 predicted paths for 2 true ones\. Fix"):
        category_accuracy([["Beauty"]], [["Beauty"], ["Beauty"]])
    with pytest.raises(ValueError, match="no items to score"):
        category_accuracy([], [])
    with pytest.raises(ValueError, match=r"has no level\. Fix"):
        category_accuracy([["Beauty"]], [[]])


def test_split_path_and_the_distribution_of_answers() -> None:
    assert split_path("Beauty >  Skin Care > ") == ["Beauty", "Skin Care"]
    assert split_path("Beauty/Skin Care", separator="/") == ["Beauty", "Skin Care"]
    spread = distribution([*TRUE, ["Beauty", "Skin Care"]], depth=2, top=2)
    assert spread == {"items": 5, "distinct": 3, "most_common": [["Beauty > Skin Care", 0.6], ["Beauty > Makeup", 0.2]]}
