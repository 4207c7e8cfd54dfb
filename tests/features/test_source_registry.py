"""The source registry: names, input/option checks, and the synthetic source."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import polars as pl
import pytest

from features.sources import SOURCES, load_source
from recsys.errors import ConfigError

needs_synthetic = pytest.mark.skipif(
    importlib.util.find_spec("features.synthetic") is None, reason="features/synthetic.py is not written yet"
)


def test_registry_names() -> None:
    assert sorted(SOURCES) == ["amazon-p5", "amazon-p5-domains", "amazon-raw", "movielens", "synthetic"]


def test_unknown_source_lists_the_valid_ones() -> None:
    with pytest.raises(
        ConfigError, match="unknown source 'imdb'; valid sources: amazon-p5, amazon-p5-domains, amazon-raw, movielens"
    ):
        load_source("imdb", None)


def test_file_source_needs_an_input() -> None:
    with pytest.raises(ConfigError, match="needs an input path"):
        load_source("movielens", None)


def test_unknown_option_is_rejected(p5_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not take option\(s\) \['num_users'\]; it accepts: domain"):
        load_source("amazon-p5", p5_dir, num_users=5)


@pytest.mark.parametrize(
    ("source", "options", "problem"),
    [
        ("synthetic", {"num_users": True}, "num_users: Input should be a valid integer"),
        ("synthetic", {"num_users": "50"}, "num_users: Input should be a valid integer"),
        ("synthetic", {"session_reset_prob": "0.1"}, "session_reset_prob: Input should be a valid number"),
        ("amazon-p5-domains", {"domains": "beauty"}, "domains: Input should be a valid array"),
    ],
)
def test_an_option_of_the_wrong_type_is_named(source: str, options: dict, problem: str, p5_dir: Path) -> None:
    path = None if source == "synthetic" else p5_dir
    with pytest.raises(ConfigError, match=rf"source '{source}': {problem}\. Fix: give the option a value of that"):
        load_source(source, path, **options)


def test_none_options_are_ignored(p5_dir: Path) -> None:
    raw = load_source("amazon-p5", p5_dir, num_users=None, domain="kids")
    assert set(raw.interactions["domain"]) == {"kids"}


def test_synthetic_takes_no_input(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="takes no input path"):
        load_source("synthetic", tmp_path)


@needs_synthetic
def test_synthetic_source_is_deterministic() -> None:
    first = load_source("synthetic", None, num_users=40, num_items=72, seed=1)
    again = load_source("synthetic", None, num_users=40, num_items=72, seed=1)
    assert first.source == "synthetic"
    assert first.interactions["user_id"].n_unique() == 40
    assert first.interactions.equals(again.interactions)


@needs_synthetic
def test_synthetic_domains_and_how_users_spread_over_them_are_options() -> None:
    def majority_share(concentration: float) -> float:
        raw = load_source("synthetic", None, num_users=200, num_items=96, domains=["beauty", "sports"],
                          domain_concentration=concentration)  # fmt: skip
        assert set(raw.interactions["domain"]) == {"beauty", "sports"} == set(raw.items["domain"])
        counts = (
            raw.interactions.group_by("user_id", "domain")
            .len()
            .group_by("user_id")
            .agg(share=pl.col("len").max() / pl.col("len").sum())
        )
        return float(counts["share"].mean())

    assert majority_share(0.05) > 0.95 > 0.9 > majority_share(20.0)  # one domain per user vs both alike
    with pytest.raises(ConfigError, match="domains"):
        load_source("synthetic", None, num_users=20, domains=["garden"])
