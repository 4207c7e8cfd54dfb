"""The registry of model families: every family's params checked before any data is read (every impossible value
named by its key), what each family reads, registering a family, and families from installed packages' entry
points."""

from __future__ import annotations

from typing import Any

import pytest

from recsys.errors import ConfigError
from recsys.models.family import Input
from recsys.models.registry import family_names, inputs_read, model_family

NAMES = family_names()


def check_params(name: str, params: dict[str, Any]) -> None:
    model_family(name).check_params(params)


@pytest.mark.parametrize("name", NAMES)
def test_the_defaults_and_the_stand_ins_of_every_model_pass(name: str) -> None:
    check_params(name, {})


@pytest.mark.parametrize(("name", "key"), [(name, key) for name in NAMES for key in model_family(name).filled])
def test_what_the_build_fills_in_is_not_a_param(name: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"model.params.{key}: unknown key"):
        check_params(name, {key: model_family(name).filled[key]})


@pytest.mark.parametrize(
    ("name", "params", "reads"),
    [
        ("popularity", {}, set()),
        ("sasrec", {}, set()),
        ("sasrec", {"sid_levels": 2}, {Input.SEMANTIC_IDS}),
        ("two_tower", {"use_content": True}, {Input.CONTENT}),
        ("query_aware", {}, {Input.CONTENT, Input.QUERIES, Input.ITEM_TEXTS}),
        ("query_aware", {"lexical": False}, {Input.CONTENT, Input.QUERIES}),
        ("generative", {}, {Input.SEMANTIC_IDS, Input.NEW_ITEMS}),
        ("ranker", {}, {Input.RETRIEVER, Input.HOLDOUT_RETRIEVER, Input.TASKS}),
        ("domain_adapters", {}, {Input.BASE, Input.DOMAINS}),
        ("fusion", {}, {Input.MEMBERS}),
    ],
)
def test_each_family_says_what_it_reads_from_its_params(name: str, params: dict[str, Any], reads: set[Input]) -> None:
    assert inputs_read(name, params) == reads


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
