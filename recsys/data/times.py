"""When the items of a history happened, and when the recommendation is for: what time-aware models read."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HistoryTimes:
    """When things happened, for time-aware models.

    Args:
        items: (B, L) unix seconds of the history items, left-padded like them (0 = padding).
        request: (B,) unix seconds of the request: the moment the next item is predicted for (serving: now;
            leave-one-out evaluation: the held-out item's time).
    """

    items: torch.Tensor
    request: torch.Tensor

    def next_times(self) -> torch.Tensor:
        """(B, L): the moment each position predicts for, i.e. the next item's time, the request's for the last.

        Example:
            >>> HistoryTimes(torch.tensor([[0, 10, 20]]), torch.tensor([95])).next_times().tolist()
            [[10, 20, 95]]
        """
        return torch.cat([self.items[:, 1:], self.request.to(self.items)[:, None]], dim=1)
