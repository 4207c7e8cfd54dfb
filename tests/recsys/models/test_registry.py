"""The registry of model families: every family's params checked before any data is read (every impossible value
named by its key), what each family reads, registering a family, and families from installed packages' entry
points."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from recsys.errors import ConfigError
from recsys.models.family import Input
from recsys.models.registry import BUILTIN_FAMILIES, family_names, inputs_read, model_family, register_family

NAMES = family_names()
REPO = Path(__file__).resolve().parents[3]


def check_params(name: str, params: dict[str, Any]) -> None:
    model_family(name).check_params(params)


RANKER_UPSTREAM = {Input.RETRIEVER, Input.HOLDOUT_RETRIEVER, Input.EXTRA_RETRIEVERS, Input.EXTRA_HOLDOUT_RETRIEVERS}


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
        ("ranker", {}, {*RANKER_UPSTREAM, Input.TASKS}),
        (
            "ranker",
            {"use_content": True, "sources": [{"kind": "retriever", "top": 9}, {"kind": "new_items", "top": 3}]},
            {*RANKER_UPSTREAM, Input.TASKS, Input.CONTENT, Input.ITEM_COUNTS},  # the new items: never trained on
        ),
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


PLUGIN = """
from dataclasses import dataclass

import torch

from recsys.models.family import Model, ModelFamily


@dataclass(frozen=True)
class ConstantConfig:
    num_items: int


class Constant(Model[ConstantConfig]):
    max_history = 1

    def score(self, histories, users=None, times=None):
        return torch.zeros(len(histories), self.config.num_items + 1)


FAMILY = ModelFamily("constant", ConstantConfig, Constant, lambda fields, inputs: Constant(ConstantConfig(**fields)),
                     training="frozen")
NOT_A_FAMILY = "constant"
"""


def _with_plugin(tmp_path: Path, entry: str) -> subprocess.CompletedProcess[str]:
    """A fresh process importing the registry, with an installed package whose `recsys.model_families` entry point
    is `entry`."""
    (tmp_path / "my_plugin.py").write_text(PLUGIN)
    info = tmp_path / "my_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[recsys.model_families]\nconstant = {entry}\n")
    code = "from recsys.models.registry import build_model, family_names; print(family_names()); " \
           "print(build_model('constant', {}, 4).score(__import__('torch').zeros(2, 1)).shape)"  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_an_installed_package_adds_a_family_through_its_entry_point(tmp_path: Path) -> None:
    run = _with_plugin(tmp_path, "my_plugin:FAMILY")
    assert run.returncode == 0, run.stderr
    assert "'constant'" in run.stdout and "torch.Size([2, 5])" in run.stdout


def test_an_entry_point_that_is_not_a_family_is_named(tmp_path: Path) -> None:
    run = _with_plugin(tmp_path, "my_plugin:NOT_A_FAMILY")
    assert run.returncode != 0
    assert "entry point constant = my_plugin:NOT_A_FAMILY of group recsys.model_families is a str" in run.stderr


def test_a_taken_name_is_refused_and_registering_again_is_a_no_op() -> None:
    sasrec = model_family("sasrec")
    assert register_family(sasrec) is sasrec
    with pytest.raises(ConfigError, match=r"model family 'sasrec' is registered already \(by recsys.models.sasrec\)"):
        register_family(dataclasses.replace(sasrec))


def test_a_builtin_family_is_imported_when_its_name_is_first_looked_up() -> None:
    """Loading one family's model does not import the others (a server of a SASRec bundle stays small)."""
    code = (
        "import sys; from recsys.models.registry import BUILTIN_FAMILIES, model_family\n"
        "assert not [m for m in BUILTIN_FAMILIES.values() if m in sys.modules], 'imported before any lookup'\n"
        "assert model_family('sasrec').name == 'sasrec'\n"
        "print(sorted(m for m in BUILTIN_FAMILIES.values() if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["['recsys.models.sasrec']"]


@pytest.mark.parametrize("name", sorted(BUILTIN_FAMILIES))
def test_each_builtin_module_holds_the_family_of_its_name(name: str) -> None:
    assert model_family(name).model.__module__ == BUILTIN_FAMILIES[name]
