"""What an enrichment made, for the evaluation report and the dashboard's Metadata section: coverage of the
catalogue, validity, the commonest failures, the model and prompt, and a few records to read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from recsys.data.schema import ITEM_ID
from recsys.enrich.record import FIELDS


def metadata_summary(path: Path, catalogue_items: int, examples: int = 10, failures: int = 5) -> dict[str, Any]:
    """The summary of an item_metadata.parquet over a catalogue of `catalogue_items` items: `examples` valid records
    (a seeded sample, the same each time) and the `failures` commonest reasons (the field and what was wrong)."""
    frame = pl.read_parquet(path)
    ok = frame.filter(pl.col("status") == "ok")
    reasons = (
        frame.filter(pl.col("status") == "failed")
        .select(pl.col("problem").fill_null("no answer").str.extract(r"^([^:]*:?[^,.;]{0,60})", 1).alias("reason"))
        .group_by("reason")
        .len()
        .sort(["len", "reason"], descending=[True, False])
        .head(failures)
    )
    answered = frame.height
    return {
        "catalogue_items": catalogue_items,
        "items": answered,
        "ok": ok.height,
        "failed": answered - ok.height,
        "coverage": ok.height / catalogue_items if catalogue_items else 0.0,
        "valid_fraction": ok.height / answered if answered else 0.0,
        "truncated": int((frame["truncated"].fill_null("") != "").sum()),
        "failures": [{"reason": r, "items": n} for r, n in reasons.iter_rows()],
        "models": sorted(frame["model"].unique().to_list()),
        "prompt_versions": sorted(frame["prompt_version"].unique().to_list()),
        "examples": ok.sample(n=min(examples, ok.height), seed=0).select(ITEM_ID, *FIELDS).to_dicts(),
    }
