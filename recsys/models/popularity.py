"""Most-popular baseline: the same ranking for every user."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from pydantic import PositiveInt

from recsys.data.times import HistoryTimes
from recsys.models.family import DEFAULT_MAX_HISTORY, Model, ModelFamily, ModelInputs


@dataclass(frozen=True)
class PopularityConfig:
    num_items: int
    # history items passed on to `score`: popularity reads none of them, serving excludes the seen ones among them
    max_history: PositiveInt = DEFAULT_MAX_HISTORY


class Popularity(Model[PopularityConfig]):
    """Scores items by their training frequency; ties broken by lower item_idx, so the order is strict.

    Example:
        >>> model = Popularity(PopularityConfig(num_items=3))
        >>> model.fit(torch.tensor([0, 5, 1, 2]))
        >>> model.score(torch.zeros(1, 4, dtype=torch.long)).argsort(descending=True)[0, :2].tolist()
        [1, 3]
    """

    item_scores: torch.Tensor  # (V+1,) buffer

    def __init__(self, config: PopularityConfig) -> None:
        super().__init__(config)
        self.register_buffer("item_scores", torch.zeros(config.num_items + 1))

    @property
    def max_history(self) -> int:
        return self.config.max_history

    def fit(self, item_counts: torch.Tensor) -> None:
        """Args: item_counts (V+1,) training frequency per item_idx."""
        order = torch.argsort(item_counts[1:].double(), descending=True, stable=True) + 1
        scores = torch.empty(self.config.num_items + 1)
        scores[order] = torch.arange(self.config.num_items, 0, -1, dtype=torch.float32)
        scores[0] = float("-inf")
        self.item_scores.copy_(scores)

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) histories (only their count is used; `users`, `times` are ignored) -> (B, V+1) popularity."""
        return self.item_scores.expand(histories.shape[0], -1).clone()


def _build(fields: dict[str, Any], inputs: ModelInputs) -> Popularity:
    return Popularity(FAMILY.validate(fields))


FAMILY = ModelFamily("popularity", PopularityConfig, Popularity, _build, training="counts")
