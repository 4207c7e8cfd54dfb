"""The search protocol's queries: words taken from titles, each level's shape, the same queries for the same seed,
and test queries disjoint from training queries."""

from __future__ import annotations

import numpy as np
import pytest

from recsys.evaluation.queries import LEVELS, QueryMaker, most_similar, title_words

TITLES = [
    "",  # the padding item
    "Neutrogena Oil-Free Acne Wash, 6 Ounce (Pack of 2)",
    "WAWO 15 Color Professional Makeup Eyeshadow Camouflage Facial Concealer Neutral Palette",
    "Xtreme Brite Brightening Gel 1oz.",
    "Gel",  # one word: the training queries take every query it can give
    "6 oz",  # no usable word
]
NEIGHBOURS = np.array([0, 3, 1, 2, 3, 1])


def test_words_drop_stopwords_quantities_and_repeats() -> None:
    assert title_words("The Gel, the GEL and 1oz of 2-in-1 Gel-Cream x") == ["gel", "gel-cream"]


@pytest.mark.parametrize("level", LEVELS)
def test_each_level_takes_its_words_from_the_titles(level: str) -> None:
    maker = QueryMaker(TITLES, NEIGHBOURS, seed=0)
    queries = maker.test_queries(range(1, 4), level)  # type: ignore[arg-type]
    for item, query in zip(range(1, 4), queries, strict=True):
        words = query.split()
        own = set(title_words(TITLES[item]))
        if level == "title-3":
            assert len(words) == 3 and set(words) <= own
        elif level == "title-1-2":
            assert 1 <= len(words) <= 2 and set(words) <= own
        else:
            assert len(words) == 2 and words[0] in own
            assert words[1] in set(title_words(TITLES[int(NEIGHBOURS[item])])) - {words[0]}


def test_the_same_seed_asks_the_same_queries_and_another_seed_others() -> None:
    targets = [1, 2, 3, 2, 1]
    first = QueryMaker(TITLES, NEIGHBOURS, seed=0).test_queries(targets, "title-1-2")
    assert first == QueryMaker(TITLES, NEIGHBOURS, seed=0).test_queries(targets, "title-1-2")
    others = [QueryMaker(TITLES, NEIGHBOURS, seed=s).test_queries(targets, "title-1-2") for s in range(1, 6)]
    assert any(o != first for o in others)


def test_test_queries_never_equal_a_training_query_of_their_item() -> None:
    maker = QueryMaker(TITLES, NEIGHBOURS, seed=0)
    training = maker.training_queries(range(1, len(TITLES)), per_item=6)
    assert training[5] == []  # no usable word: no query
    for level in LEVELS:
        targets = [1, 2, 3, 4, 5] * 20
        for item, query in zip(targets, maker.test_queries(targets, level, training), strict=True):
            assert query == "" or query not in training[item]
    # "gel" is the one query item 4 can give, and a training query already: its test query is dropped
    assert set(maker.test_queries([4], "title-1-2", training)) == {""}


def test_neighbour_mix_needs_the_neighbours() -> None:
    with pytest.raises(ValueError, match="neighbour-mix level needs `neighbours`"):
        QueryMaker(TITLES).test_queries([1], "neighbour-mix")


def test_most_similar_is_the_closest_other_item_by_cosine() -> None:
    vectors = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [-1.0, 0.2]])  # items 1..4
    assert most_similar(vectors, block=3).tolist() == [0, 2, 1, 4, 3]  # (row 0: the padding)
