"""Rank fusion of trained retrievers at the top-k level, evaluated and served like any single model.

Reciprocal rank fusion (Cormack et al., SIGIR 2009): an item's fused score is sum_m w_m / (rrf_k + rank_m), over the
members whose top-`depth` list holds it (rank 1 = best). It needs only each member's ranking, so models whose
scores are not comparable (a generative model's beam log-probabilities, a dot-product retriever's logits) combine
without calibration. Items no member ranks score -inf (a miss, as outside a generative model's beam).

Dimension letters: B users, V+1 items, M members.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import torch
from pydantic import NonNegativeInt, PositiveInt
from torch import nn

from recsys.data.times import HistoryTimes
from recsys.errors import ConfigError
from recsys.models.family import Input, Model, ModelFamily, ModelInputs, Rebuild, UpstreamRole, check_items


@dataclass(frozen=True)
class FusionConfig:
    num_items: int
    # each member as saved: {"name": registry name, "config": its config fields}; filled from model directories
    members: list[dict[str, Any]] = field(default_factory=list)
    weights: list[float] | None = None  # per member; None = equal
    rrf_k: NonNegativeInt = 60  # damping: larger = flatter weight across ranks (60 as in the RRF paper)
    depth: PositiveInt = 100  # ranks taken from each member


class Fusion(Model[FusionConfig]):
    """Reciprocal rank fusion of `members` (trained retrievers, frozen)."""

    def __init__(self, config: FusionConfig, members: list[Model[Any]]) -> None:
        super().__init__(config)
        if len(members) < 2:
            raise ValueError(f"fusion needs at least 2 members, got {len(members)}")
        if config.weights is not None and len(config.weights) != len(members):
            raise ValueError(f"fusion has {len(members)} members but {len(config.weights)} weights")
        self.members = nn.ModuleList(members)
        self.members.requires_grad_(False)

    @property
    def max_history(self) -> int:
        """The longest history any member reads: each member keeps its own most recent part."""
        return max(member.max_history for member in self._members())

    @torch.no_grad()
    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories [+ (B,) users, the times, passed on to the members] -> (B, V+1)
        fused scores, -inf where no member ranks."""
        weights = self.config.weights or [1.0] * len(self.members)
        fused: torch.Tensor | None = None
        for member, weight in zip(self._members(), weights, strict=True):
            scores = member.score(histories, users, times)
            top = scores.topk(min(self.config.depth, scores.shape[1]), dim=1)  # (B, depth) best first
            ranks = torch.arange(1, top.indices.shape[1] + 1, device=scores.device, dtype=torch.float32)
            contribution = (weight / (self.config.rrf_k + ranks)).expand_as(top.values)
            contribution = contribution.masked_fill(top.values == float("-inf"), 0.0)  # beyond a beam: not ranked
            if fused is None:
                fused = torch.zeros(scores.shape, device=scores.device)
            fused.scatter_add_(1, top.indices, contribution)
        assert fused is not None
        fused[:, 0] = 0.0  # the padding item
        return fused.masked_fill(fused == 0.0, float("-inf"))

    def _members(self) -> list[Model[Any]]:
        return cast(list[Model[Any]], list(self.members))  # a ModuleList is typed as holding Modules


def _build(fields: dict[str, Any], inputs: ModelInputs) -> Fusion:
    if len(inputs.members) < 2:
        raise ConfigError(f"model 'fusion' needs {MEMBERS.key}: a list of >= 2 trained model directories")
    for member in inputs.members:
        check_items(member, fields["num_items"], MEMBERS.key)
    config = FAMILY.validate({**fields, "members": [member.saved() for member in inputs.members]})
    return Fusion(config, [member.model for member in inputs.members])


def _shape(config: FusionConfig, rebuild: Rebuild) -> Fusion:
    return Fusion(config, [rebuild(member) for member in config.members])


MEMBERS = UpstreamRole("members", Input.MEMBERS, "the trained models it combines (two or more)", many=True)
FAMILY = ModelFamily(
    "fusion", FusionConfig, Fusion, _build, training="frozen", upstream=(MEMBERS,), shape=_shape,
    filled={"num_items": 1, "members": []},
)  # fmt: skip
