"""Reciprocal rank fusion: the formula, beams that end early, and fusion of saved models through the registry."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from recsys.data.times import HistoryTimes
from recsys.errors import ConfigError
from recsys.models.family import ModelInputs, Upstream
from recsys.models.fusion import Fusion, FusionConfig
from recsys.models.registry import build_model, load_model, save_model

NEG_INF = float("-inf")


class FixedScores(nn.Module):
    """A member that scores every user the same way."""

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.scores = torch.tensor([scores])

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        return self.scores.expand(histories.shape[0], -1)


def test_fused_score_is_the_weighted_sum_of_reciprocal_ranks() -> None:
    #                   pad   1    2    3    4
    a = FixedScores([0.0, 4.0, 3.0, 2.0, 1.0])  # ranks 1..4 = items 1, 2, 3, 4
    b = FixedScores([0.0, NEG_INF, 1.0, 3.0, NEG_INF])  # a beam of two: item 3 first, then item 2
    fusion = Fusion(FusionConfig(num_items=4, weights=[1.0, 2.0], rrf_k=1, depth=3), [a, b])
    scores = fusion.score(torch.zeros(2, 3, dtype=torch.long))
    expected = torch.tensor([NEG_INF, 1 / 2, 1 / 3 + 2 / 3, 1 / 4 + 2 / 2, NEG_INF])  # item 4: below depth 3
    torch.testing.assert_close(scores, expected.expand(2, -1))
    assert scores[0].argmax() == 3  # ranked high by both members


def test_fusion_of_saved_models_round_trips_through_the_registry(tmp_path: Path) -> None:
    torch.manual_seed(0)
    members = []
    for name, params in [("sasrec", {"max_history": 6, "dim": 8, "num_heads": 1, "ffn_dim": 16}),
                         ("hstu", {"max_history": 9})]:  # fmt: skip
        save_model(tmp_path / f"{name}.pt", build_model(name, params, num_items=15))
        members.append(Upstream(*load_model(tmp_path / f"{name}.pt")))
    fusion = build_model("fusion", {"depth": 5}, num_items=15, inputs=ModelInputs(members=tuple(members)))
    assert isinstance(fusion, Fusion)
    assert fusion.max_history == 9, "the history fed to the members must cover the longest reader"
    save_model(tmp_path / "fusion.pt", fusion)
    _, loaded = load_model(tmp_path / "fusion.pt")
    history = torch.tensor([[0, 1, 2, 3]])
    fused = loaded.score(history)
    torch.testing.assert_close(fused, fusion.eval().score(history))
    assert 5 <= int(torch.isfinite(fused).sum()) <= 10  # the union of two top-5 lists


def test_fusion_config_errors_say_what_to_fix() -> None:
    with pytest.raises(ConfigError, match=r"needs model\.upstream\.members"):
        build_model("fusion", {}, num_items=3)
    with pytest.raises(ValueError, match="2 members but 1 weights"):
        Fusion(FusionConfig(num_items=3, weights=[1.0]), [FixedScores([0.0] * 4), FixedScores([0.0] * 4)])
    with pytest.raises(ValueError, match="at least 2 members"):
        Fusion(FusionConfig(num_items=3), [FixedScores([0.0] * 4)])
