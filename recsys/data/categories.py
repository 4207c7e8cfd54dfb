"""Items' category levels as sparse ids: the table a model reads to embed an item's categories and to predict the
next item's category (docs/ranking.md, "Category features and tasks").

The prepared items carry `category_path` (a list of levels from the top, e.g. ["Beauty", "Makeup", "Lips"]) when the
experiment names `data.attributes.categories` (`features.attributes`, docs/data.md). Level k's value is the path's
prefix down to level k ("Beauty > Makeup" at level 2), so a "Lips" under "Makeup" and one under "Skin Care" are two
values; the values of level k, sorted, get ids 1..n_k, and 0 is none: the padding item, an item without a path, or a
level below an item's deepest. The table is built once from the prepared items (`SequenceData.items`) with
`MAX_CATEGORY_LEVELS` levels; a model keeps its first `category_levels` columns in its state dict, so serving reads
no table (and no polars).

Dimension letters: V+1 items (0 = padding), K levels.

Example:
    >>> import polars as pl
    >>> items = pl.DataFrame({"item_idx": [1, 2, 3], "category_path": [["B", "M"], ["B", "S"], None]})
    >>> table = category_table(items)
    >>> table.ids[:, :3].tolist(), table.sizes[:3]
    ([[0, 0, 0], [1, 1, 0], [1, 2, 0], [0, 0, 0]], (1, 2, 0))
    >>> category_table(items.drop("category_path")) is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from recsys.data.schema import ITEM_IDX

if TYPE_CHECKING:  # building the table reads polars; a model reading it does not
    import polars as pl

CATEGORY_PATH = "category_path"  # items.parquet: list[str], the levels from the top (written by features.attributes)
MAX_CATEGORY_LEVELS = 8  # the deepest path an attribute file may hold (Amazon's deepest have 6 or 7)
CATEGORY_TASK_PREFIX = "category_l"  # task "category_l<k>": the next item's category at level k (1 = the top)


@dataclass(frozen=True)
class CategoryTable:
    """`ids` (V+1, MAX_CATEGORY_LEVELS) int64: each item's id at each level (0: none); `sizes`: n_k of each level."""

    ids: torch.Tensor
    sizes: tuple[int, ...]


def category_table(items: pl.DataFrame) -> CategoryTable | None:
    """The items' category-level ids (`items` sorted by item_idx 1..V); None without a `category_path` column."""
    if CATEGORY_PATH not in items.columns:
        return None
    paths = items.sort(ITEM_IDX).get_column(CATEGORY_PATH).to_list()
    ids = torch.zeros(len(paths) + 1, MAX_CATEGORY_LEVELS, dtype=torch.int64)
    sizes = []
    for level in range(MAX_CATEGORY_LEVELS):
        prefixes = [" > ".join(path[: level + 1]) if path and len(path) > level else None for path in paths]
        values = {value: i for i, value in enumerate(sorted({p for p in prefixes if p is not None}), start=1)}
        ids[1:, level] = torch.tensor([values.get(p, 0) if p is not None else 0 for p in prefixes], dtype=torch.int64)
        sizes.append(len(values))
    return CategoryTable(ids, tuple(sizes))


def category_task_names(levels: int) -> tuple[str, ...]:
    """The category tasks of a model reading `levels` levels: category_l1 .. category_l<levels>."""
    return tuple(f"{CATEGORY_TASK_PREFIX}{level}" for level in range(1, levels + 1))
