"""The embed_content step: catalog text -> content_embeddings.npy in item order, skipped when up to date."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from pipelines.config import SidSection, load_config
from pipelines.content import CONTENT_META_FILE, embed_content_step
from pipelines.data import prepare_step
from pipelines.semantic_ids import build_semantic_ids_step
from recsys.data.schema import ITEM_IDX, ITEMS_FILE
from recsys.errors import RecsysError
from recsys.semantic_ids.codes import read_semantic_ids
from recsys.semantic_ids.content import ContentConfig, embed_items, item_texts, read_content_embeddings


def test_embeddings_are_the_encoders_in_item_order_and_a_rerun_skips(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    config = load_config(tiny_config(tmp_path))
    data_dir = prepare_step(config.data, tmp_path / "data")
    content = ContentConfig(text_fields=("title",), progress=False)
    path = embed_content_step(content, data_dir, tmp_path / "content", tmp_path / "cache")

    items = pl.read_parquet(data_dir / ITEMS_FILE).sort(ITEM_IDX)
    vectors = read_content_embeddings(path, items.height)
    np.testing.assert_allclose(vectors, embed_items(items, content, tmp_path / "cache"), rtol=1e-6)
    meta = json.loads((path.parent / CONTENT_META_FILE).read_text())
    assert meta["items"] == items.height and meta["dim"] == vectors.shape[1] == 384

    written = path.stat().st_mtime_ns
    assert embed_content_step(content, data_dir, tmp_path / "content", tmp_path / "cache") == path
    assert path.stat().st_mtime_ns == written  # skipped: same settings, same catalog
    other = ContentConfig(text_fields=("title", "category"), progress=False)
    embed_content_step(other, data_dir, tmp_path / "content", tmp_path / "cache")
    assert json.loads((path.parent / CONTENT_META_FILE).read_text())["fingerprint"] != meta["fingerprint"]

    with pytest.raises(RecsysError, match="re-run embed_content"):
        read_content_embeddings(path, items.height + 1)


@pytest.mark.parametrize(
    ("corrupt", "problem"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:20]), "not valid JSON: it ends in the middle of a value"),
        (lambda p: p.write_text('"fingerprint"'), "holds a JSON str, not the object expected"),
    ],
)
def test_a_content_meta_that_does_not_read_embeds_again(
    tmp_path: Path, tiny_config: Callable[..., Path], caplog: pytest.LogCaptureFixture,
    corrupt: Callable[[Path], object], problem: str,
) -> None:  # fmt: skip
    config = load_config(tiny_config(tmp_path))
    data_dir = prepare_step(config.data, tmp_path / "data")
    content = ContentConfig(text_fields=("title",), progress=False)
    path = embed_content_step(content, data_dir, tmp_path / "content", tmp_path / "cache")
    meta = json.loads((path.parent / CONTENT_META_FILE).read_text())
    corrupt(path.parent / CONTENT_META_FILE)
    assert embed_content_step(content, data_dir, tmp_path / "content", tmp_path / "cache") == path  # no traceback
    assert json.loads((path.parent / CONTENT_META_FILE).read_text()) == meta  # written whole again
    assert f"{path.parent / CONTENT_META_FILE}: {problem}" in caplog.text


def test_semantic_ids_are_built_from_titles_and_category_paths(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    categories = tmp_path / "item_categories.csv"
    categories.write_text("item_id,categories\n" + "\n".join(f"i{n:05d},Top{n % 3} > Sub{n % 2}" for n in range(200)))
    config = load_config(tiny_config(tmp_path, data={"attributes": {"categories": str(categories)}}))
    data_dir = prepare_step(config.data, tmp_path / "data")
    items = pl.read_parquet(data_dir / ITEMS_FILE).sort(ITEM_IDX)
    assert items.schema["category_path"] == pl.List(pl.String)  # a list column: the catalog is not flat
    content = ContentConfig(text_fields=("title", "category_path"), progress=False)
    assert "category path: Top" in item_texts(items, content.text_fields)[0]
    embeddings = embed_content_step(content, data_dir, tmp_path / "content", tmp_path / "cache")
    section = SidSection(method="rqkmeans", rqkmeans={"levels": 2, "codebook_size": 4})
    path = build_semantic_ids_step(section, content, data_dir, embeddings, tmp_path / "sid")
    assert read_semantic_ids(path)[0].codes.shape[0] == items.height + 1  # row 0: padding
    written = path.stat().st_mtime_ns
    assert build_semantic_ids_step(section, content, data_dir, embeddings, tmp_path / "sid") == path
    assert path.stat().st_mtime_ns == written  # the same catalog, category paths included: skipped
