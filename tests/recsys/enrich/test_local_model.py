"""The packaged local model (Gemma 3 270M, from its PyPI package) writes records for three items on the CPU: every
answer parses and passes the record's checks, keywords are spans of the item's own text, and the category is one of
the prompt's; a batch writes what each item alone writes. The GGUF file is converted once into a cache that later
runs reuse (about a minute and a half)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import polars as pl

from recsys.enrich.cache import EnrichCache
from recsys.enrich.local import LocalBackend
from recsys.enrich.record import load_prompt
from recsys.enrich.run import enrich_catalogue

MODELS = Path(os.environ.get("RECSYS_TEST_CACHE", Path.home() / ".cache" / "recsys-tests")) / "enrich"
TITLES = [
    "Burt's Bees Beeswax Lip Balm, 4 Tubes",
    "Remington Pearl Pro Ceramic 1 1/2 Inch Curling Iron",
    "Maybelline New York Great Lash Mascara, Blackest Black",
]


def test_the_packaged_model_writes_three_valid_grounded_records(tmp_path: Path) -> None:
    backend = LocalBackend(cache_dir=MODELS, device="cpu")
    prompt = load_prompt()
    out = tmp_path / "item_metadata.parquet"
    summary = enrich_catalogue(["a", "b", "c"], TITLES, backend, prompt, EnrichCache(tmp_path), out, batch_size=3)
    assert (summary.ok, summary.failed, summary.valid_fraction) == (3, 0, 1.0)
    assert summary.model.startswith("gemma-3-270m-q4_k_m@")
    assert summary.load_seconds > 0.5  # the model's load, timed apart from the answers' items/s
    for row, title in zip(pl.read_parquet(out).iter_rows(named=True), TITLES, strict=True):
        words = " ".join(re.findall(r"\S+", title.lower()))
        assert row["category"] in prompt.categories and row["description"] and 2 <= len(row["queries"]) <= 3
        assert all(keyword.lower() in words for keyword in row["keywords"]), (row["keywords"], title)


def test_a_batch_writes_what_each_item_alone_writes() -> None:
    """Rows of a batch are padded between the shared prefix and their own suffix, masked, with positions counted over
    real tokens: greedy decoding must not notice (padded batches with default positions gave degenerate output)."""
    backend = LocalBackend(cache_dir=MODELS, device="cpu")
    prompt = load_prompt()
    together = backend.generate(TITLES, prompt)
    alone = [backend.generate([title], prompt)[0] for title in TITLES]
    assert [g.text for g in together] == [g.text for g in alone]
