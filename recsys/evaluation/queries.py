"""Text queries made from an item's title: the search protocol's test queries and the training queries of
query-aware models (docs/search.md).

A query stands for what a user would type to find the item they go on to interact with. It is made from that
item's title at one of three difficulty levels, with a seeded generator so that every run asks the same queries:

    title-3        3 words of the title (in title order)                       "oil-free acne wash"
    title-1-2      1 or 2 words of the title                                   "acne"
    neighbour-mix  1 word of the title + 1 word of a neighbour's title         "acne palette"
                   (the neighbour: the item whose title embedding is closest; the Amazon P5 data has no
                   categories, so "same category" is "most similar title")

Words are the title's lowercase alphanumeric tokens (hyphens kept inside a word) of two or more characters, minus
a short list of stopwords and quantities (tokens starting with a digit: "6", "1oz"; they say little of the item).
A title with fewer words than the level asks gives all it has. Test queries are disjoint from training queries:
`training_queries` draws from another seed stream, and `test_queries` never returns a query equal to one of the
item's training queries (it draws again, and gives "" for that target when the title is too short to give another).

Dimension letters: V items, Q queries.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import polars as pl
import torch

from recsys.data.schema import ITEM_IDX, TITLE

Level = Literal["title-3", "title-1-2", "neighbour-mix"]
LEVELS: tuple[Level, ...] = ("title-3", "title-1-2", "neighbour-mix")
STOPWORDS = frozenset(
    ("a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "in", "into", "is", "it", "of", "on", "or",
     "the", "to", "with", "without", "your", "you", "oz", "ml", "fl", "pack", "count", "pcs", "set", "new", "ounce",
     "ounces", "inch", "inches")
)  # fmt: skip
_WORD = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_TEST_STREAM, _TRAIN_STREAM = 1, 2  # seed streams: test and training queries never share draws
_TRIES = 8  # draws per item before a test query that equals a training query is given up


def title_words(title: str) -> list[str]:
    """The words a query may use, in title order, each once.

    Example:
        >>> title_words("Neutrogena Oil-Free Acne Wash, 6 Ounce (Pack of 2)")
        ['neutrogena', 'oil-free', 'acne', 'wash']
    """
    seen: dict[str, None] = {}
    for word in _WORD.findall(title.lower()):
        if len(word) >= 2 and word not in STOPWORDS and not word[0].isdigit():
            seen.setdefault(word, None)
    return list(seen)


@dataclass(frozen=True)
class QueryMaker:
    """Makes queries for items from their titles.

    Args:
        titles: (V+1,) every item's title by item index (index 0, the padding, and items without a title: "").
        neighbours: (V+1,) for every item the index of the item whose title is the most similar (neighbour-mix);
            None when that level is not asked.
        seed: the protocol's seed.
    """

    titles: Sequence[str]
    neighbours: np.ndarray | None = None
    seed: int = 0

    def query(self, item: int, level: Level, rng: np.random.Generator) -> str:
        """One query for `item` at `level` ("" when its title has no usable word)."""
        words = title_words(self.titles[item])
        if not words:
            return ""
        if level == "title-3":
            return _some(words, 3, rng)
        if level == "title-1-2":
            return _some(words, int(rng.integers(1, 3)), rng)
        if self.neighbours is None:
            raise ValueError("the neighbour-mix level needs `neighbours`: the most similar item of every item")
        own = _some(words, 1, rng)
        other = [w for w in title_words(self.titles[int(self.neighbours[item])]) if w != own]
        return own if not other else f"{own} {_some(other, 1, rng)}"

    def training_queries(self, items: Sequence[int], per_item: int) -> dict[int, list[str]]:
        """`per_item` training queries of each item, the levels in turn (the same items, seed: the same queries)."""
        out: dict[int, list[str]] = {}
        for item in items:
            rng = np.random.default_rng([self.seed, _TRAIN_STREAM, item])
            made = [self.query(item, LEVELS[k % len(LEVELS)], rng) for k in range(per_item)]
            out[item] = [q for q in made if q]
        return out

    def test_queries(
        self, targets: Sequence[int], level: Level, training: Mapping[int, Sequence[str]] | None = None
    ) -> list[str]:
        """(Q,) one query per test target at `level`, none equal to a training query of the same item ("" for a
        target with no usable word, or whose title cannot give a query the training queries do not hold)."""
        out = []
        for user, item in enumerate(targets):
            rng = np.random.default_rng([self.seed, _TEST_STREAM, LEVELS.index(level), user])
            taken = set(training.get(item, ())) if training else set()
            query = ""
            for _ in range(_TRIES):
                query = self.query(item, level, rng)
                if query not in taken:
                    break
            out.append("" if query in taken else query)
        return out


def _some(words: list[str], n: int, rng: np.random.Generator) -> str:
    """`n` of `words` (all of them when fewer), drawn without replacement, joined in their title order."""
    if len(words) <= n:
        return " ".join(words)
    picked = np.sort(rng.choice(len(words), size=n, replace=False))
    return " ".join(words[i] for i in picked)


def catalogue_titles(items: pl.DataFrame) -> list[str]:
    """(V+1,) every item's title by item index, as `QueryMaker` reads them: "" for the padding (index 0) and for items
    without a title (or a catalogue without titles).

    Example:
        >>> catalogue_titles(pl.DataFrame({"item_idx": [2, 1], "title": ["Eye Shadow", None]}))
        ['', '', 'Eye Shadow']
    """
    items = items.sort(ITEM_IDX)
    return ["", *(items[TITLE].fill_null("").to_list() if TITLE in items.columns else [""] * items.height)]


def most_similar(vectors: np.ndarray, block: int = 4096) -> np.ndarray:
    """(V+1,) for every item the index of the other item whose vector is closest by cosine (the neighbour-mix
    level's neighbour); row 0 is the padding (0). Exact, a block of rows at a time: V^2 dot products.

    Args:
        vectors: (V, C) item vectors, row i = item index i + 1 (content_embeddings.npy's layout).
    """
    items = torch.nn.functional.normalize(torch.from_numpy(np.asarray(vectors, dtype=np.float32)), dim=1)
    out = np.zeros(len(items) + 1, dtype=np.int64)
    for start in range(0, len(items), block):
        sims = items[start : start + block] @ items.T  # (block, V)
        rows = torch.arange(len(sims))
        sims[rows, rows + start] = -torch.inf  # not itself
        out[start + 1 : start + 1 + len(sims)] = sims.argmax(dim=1).numpy() + 1
    return out
