"""The records as item columns: only valid records are read, keywords joined, item order kept; consumers that name
them need the enrich step, and a misspelt column is refused; a run without records writes typed, joinable columns."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from pipelines.config import load_config
from recsys.enrich.cache import EnrichCache
from recsys.enrich.columns import COLUMNS, with_item_metadata
from recsys.enrich.record import load_prompt
from recsys.enrich.run import enrich_catalogue
from recsys.errors import ConfigError, DataError
from recsys.semantic_ids.content import item_texts

REPO = Path(__file__).resolve().parents[3]

LISTS = {"keywords": pl.List(pl.String), "queries": pl.List(pl.String)}


def records(path: Path) -> Path:
    pl.DataFrame({
        "item_id": ["b", "a"], "status": ["ok", "failed"], "category": ["Beauty > Hair Care", None],
        "brand": ["Remington", None], "keywords": [["curling iron", "ceramic"], None],
        "description": ["A ceramic curling iron.", None], "queries": [["curling iron", "remington curler"], None],
    }, schema_overrides=LISTS).write_parquet(path)  # fmt: skip
    return path


def test_valid_records_become_columns_in_the_items_order(tmp_path: Path) -> None:
    items = pl.DataFrame({"item_id": ["a", "b", "c"], "title": ["Lip Balm", "Pearl Pro Curling Iron", "Soap"]})
    joined = with_item_metadata(items, records(tmp_path / "m.parquet"))
    assert joined["item_id"].to_list() == ["a", "b", "c"] and set(COLUMNS) <= set(joined.columns)
    assert joined["llm_keywords"].to_list() == [None, "curling iron, ceramic", None]  # a failed answer: nothing
    assert joined["llm_queries"].to_list()[1] == ["curling iron", "remington curler"]
    assert item_texts(joined, ["title", "llm_category", "llm_keywords"]) == [
        "Lip Balm",
        "Pearl Pro Curling Iron; llm category: Beauty > Hair Care; llm keywords: curling iron, ceramic",
        "Soap",
    ]
    assert with_item_metadata(items, None) is items


def test_missing_records_name_the_file_and_the_step(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no item metadata here. Fix: run the enrich step"):
        with_item_metadata(pl.DataFrame({"item_id": ["a"]}), tmp_path / "item_metadata.parquet")


def test_consumers_of_metadata_need_the_enrich_step_and_real_columns() -> None:
    config = REPO / "configs" / "beauty" / "sasrec-sid.yaml"
    with pytest.raises(ConfigError, match=r"content.text_fields \(llm_keywords\) read LLM-written .* no `enrich`"):
        load_config(config, {"content.text_fields": ["title", "llm_keywords"]})
    with pytest.raises(ConfigError, match=r"names \['llm_keyword'\], which are not item metadata columns"):
        load_config(config, {"content.text_fields": ["title", "llm_keyword"], "enrich": {}})
    loaded = load_config(config, {"content.text_fields": ["title", "llm_keywords"], "enrich": {"records": "r.parquet"}})
    assert loaded.enrich is not None and loaded.enrich.records == "r.parquet"


def test_a_run_with_no_records_writes_typed_columns_that_join(tmp_path: Path) -> None:
    out = tmp_path / "item_metadata.parquet"
    enrich_catalogue(["a"], ["Lip Balm"], NeverAsked(), load_prompt(), EnrichCache(tmp_path), out, limit=0)
    assert pl.read_parquet(out).height == 0
    joined = with_item_metadata(pl.DataFrame({"item_id": ["a"], "title": ["Lip Balm"]}), out)
    assert joined["llm_keywords"].to_list() == [None]


class NeverAsked:
    """A backend a run must not call (everything it would ask is past its limit)."""

    name, model, constrained = "never", "none@0", True

    def generate(self, *args: object, **kwargs: object) -> list:
        raise AssertionError("asked")
