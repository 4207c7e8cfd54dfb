"""check_params: a model's params checked before any data is read, every impossible value named by its key."""

from __future__ import annotations

from typing import Any

import pytest

from recsys.errors import ConfigError
from recsys.models.registry import MODELS, check_params


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_defaults_and_the_stand_ins_of_every_model_pass(name: str) -> None:
    check_params(name, {})


@pytest.mark.parametrize(("name", "key"), [(name, key) for name, spec in MODELS.items() for key in spec.filled])
def test_what_the_build_fills_in_is_not_a_param(name: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"model.params.{key}: unknown key"):
        check_params(name, {key: MODELS[name].filled[key]})


@pytest.mark.parametrize(
    ("name", "params", "problem"),
    [
        ("sasrec", {"bogus": 1}, "model.params.bogus: unknown key (known: max_history, dim,"),
        ("sasrec", {"num_heads": 3}, "model.params.num_heads: 3 does not divide dim (64)"),
        ("sasrec", {"dropout": 1.0}, "model.params.dropout: Input should be less than 1"),
        ("sasrec", {"id_embeddings": False}, "model.params.id_embeddings: false needs sid_levels > 0"),
        ("hstu", {"max_history": 0}, "model.params.max_history: Input should be greater than 0"),
        ("hstu", {"dim": 30, "num_heads": 4}, "model.params.num_heads: 4 does not divide dim (30)"),
        ("two_tower", {"temperature": 0.0}, "model.params.temperature: Input should be greater than 0"),
        ("generative", {"new_item_slots": 60}, "model.params.new_item_slots: 60 is more than beam_size (50)"),
        ("generative", {"num_decoder_layers": 0}, "model.params.num_decoder_layers: Input should be greater than 0"),
        ("ranker", {"head": "moe", "top_k": 9}, "model.params.top_k: 9 experts per example is more than num_experts"),
        ("ranker", {"num_candidates": 0}, "model.params.num_candidates: Input should be greater than 0"),
        ("fusion", {"depth": 0}, "model.params.depth: Input should be greater than 0"),
        ("domain_adapters", {"rank": 0}, "model.params.rank: Input should be greater than 0"),
        ("popularity", {"max_history": -1}, "model.params.max_history: Input should be greater than 0"),
    ],
)
def test_impossible_params_name_the_key_and_the_fix(name: str, params: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_params(name, params)
    assert f"model {name!r}: {problem}" in str(info.value)
    assert str(info.value).endswith("Fix: correct model.params (docs/models.md)")
