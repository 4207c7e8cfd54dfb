"""The laboratory's configs are frozen like the product's: experiments under benchmarks/configs/<dataset>/ load and
keep their names; every benchmark's settings are headed by their purpose, date and command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from benchmarks.common import REPO
from pipelines.config import load_config
from tests.conftest import check_frozen_config

LAB_CONFIGS = REPO / "benchmarks" / "configs"
EXPERIMENTS = sorted(LAB_CONFIGS.glob("*/*.yaml"))
SETTINGS = sorted(LAB_CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_experiment_configs_load_and_state_their_purpose_date_and_command(path: Path) -> None:
    check_frozen_config(path)


@pytest.mark.parametrize("path", SETTINGS, ids=lambda p: p.name)
def test_benchmark_settings_state_their_purpose_date_and_command(path: Path) -> None:
    header = path.read_text().splitlines()[:8]
    for field in ("# Purpose:", "# Date:", "# Command"):  # "# Command (after ...):" where it has steps before it
        assert any(line.startswith(field) for line in header), f"{path.name} lacks '{field}'"


def test_the_products_multi_source_ranker_is_the_one_measured() -> None:
    """configs/beauty/ranker-multi-source.yaml states the figure of beauty-multi-source.json's `ranker sources + HSTU
    new 0.1` run (the lab's config with new_item_rate 0.1, its first stages given by the benchmark): the two differ
    in nothing but the paths of those first stages."""
    product = load_config(REPO / "configs" / "beauty" / "ranker-multi-source.yaml")
    measured = load_config(LAB_CONFIGS / "beauty" / "ranker-residual-sources-hstu.yaml",
                           {"model.training.new_item_rate": 0.1})  # fmt: skip
    assert product.model.upstream["extra_retrievers"] and product.model.upstream["extra_holdout_retrievers"]
    without_paths = {"name": True, "model": {"upstream"}}
    assert product.model_dump(exclude=without_paths) == measured.model_dump(exclude=without_paths)
    assert "0.0591" in (REPO / "configs" / "beauty" / "ranker-multi-source.yaml").read_text()
    labels = json.loads((REPO / "benchmarks" / "results" / "beauty-multi-source.json").read_text())["models"]
    assert f"{labels['ranker sources + HSTU new 0.1']['ndcg@10']['mean']:.4f}" == "0.0591"


def test_the_products_generative_config_is_the_one_measured() -> None:
    """configs/beauty/generative.yaml states the figures of beauty-generative.json's `generative` runs (the lab's
    category-path experiment with the comparison's overrides and its data attribute): the two differ in nothing but
    the name."""
    product = load_config(REPO / "configs" / "beauty" / "generative.yaml")
    comparison = yaml.safe_load((LAB_CONFIGS / "beauty-generative-retrieval.yaml").read_text())
    unit = next(model for model in comparison["models"] if model["label"] == "generative")
    measured = load_config(REPO / unit["config"], {**comparison["experiment"], **unit["overrides"]})
    assert product.model.params["retrieval_candidates"] == 20 and product.data.attributes
    assert product.model_dump(exclude={"name": True}) == measured.model_dump(exclude={"name": True})
    text = (REPO / "configs" / "beauty" / "generative.yaml").read_text()
    models = json.loads((REPO / "benchmarks" / "results" / "beauty-generative.json").read_text())["models"]
    for label in ("generative", "SASRec"):
        assert f"{models[label]['ndcg@10']['mean']:.4f}" in text, label
