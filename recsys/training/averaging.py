"""Exponential moving average (EMA) of a model's weights, used for validation and the saved model.

An average of the weights over the last ~1/(1 - decay) steps sits nearer the centre of the region the optimiser
wanders in than the last step does, which usually ranks a little better on held-out data (Polyak averaging).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


class WeightAverage:
    """EMA of `model`'s floating-point parameters, updated after every optimiser step.

    The decay warms up as min(decay, (1 + n) / (10 + n)) after n updates, so the random initial weights fade
    out within the first hundred steps instead of biasing the average for thousands.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}. Fix: e.g. train.optimization.ema_decay=0.999")
        self.decay = decay
        self.params: list[torch.Tensor] = [p for p in model.parameters() if p.dtype.is_floating_point]
        self.averages = [p.detach().clone() for p in self.params]
        self.updates = 0

    @torch.no_grad()
    def update(self) -> None:
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        torch._foreach_lerp_(self.averages, self.params, 1.0 - decay)  # no_grad: the parameters read as they are
        self.updates += 1

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Inside the block the model holds the averaged weights; its own weights come back after."""
        own = [p.detach().clone() for p in self.params]
        with torch.no_grad():  # written through the parameters (not .data): their versions move, caches see it
            torch._foreach_copy_(self.params, self.averages)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self.params, own)

    def state_dict(self) -> dict[str, Any]:
        return {"averages": [a.cpu() for a in self.averages], "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            saved = [a.to(own.device) for a, own in zip(state["averages"], self.averages, strict=True)]
            torch._foreach_copy_(self.averages, saved)
        self.updates = int(state["updates"])
