"""The metadata benchmark scores every kept records file's categories against the true paths without asking a model
(`only=[]`): valid answers scored, failed and never-asked items counted apart, the spread of answers beside the
truth's."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from benchmarks.metadata import RECORDS_FILE, main

TRUTH = """item_id,categories
A1,Beauty > Skin Care > Face > Creams
A2,Beauty > Makeup > Nails > Nail Polish
A3,"Beauty > Hair Care > Styling Products > Creams, Gels & Lotions"
A4,Beauty > Skin Care
A5,Beauty > Fragrance > Women's
"""


def records(answers: dict[str, str | None]) -> pl.DataFrame:
    """Records as the enrich step writes their scored columns: a None category is a failed answer."""
    return pl.DataFrame(
        {
            "item_id": list(answers),
            "status": ["ok" if c is not None else "failed" for c in answers.values()],
            "category": list(answers.values()),
        }
    )


def test_kept_records_are_scored_against_the_true_paths(tmp_path: Path) -> None:
    (tmp_path / "items.csv").write_text("item_id,title\nA1,cream\n")
    (tmp_path / "categories.csv").write_text(TRUTH)
    greedy = {"A1": "Beauty > Skin Care", "A2": "Beauty > Nail Care", "A3": "Toys > Building Toys", "A4": None}
    records(greedy).write_parquet(tmp_path / RECORDS_FILE)  # A5 never asked
    records({"A1": "Beauty > Skin Care", "A2": "Beauty > Makeup"}).write_parquet(tmp_path / "whole-option.parquet")
    previous = {"runs": {"gpu-batched": {"keep_records": True},
                         "gpu-batched-whole": {"keep_records": "whole-option.parquet"},
                         "cpu": {"keep_records": False}}}  # fmt: skip
    (tmp_path / "beauty-metadata.json").write_text(json.dumps(previous))
    main(["--set", "only=[]", "--set", f"items_csv={tmp_path / 'items.csv'}", "--set", "uncertainty.resamples=50",
          "--set", f"categories_csv={tmp_path / 'categories.csv'}", "--results-dir", str(tmp_path),
          "--set", "runs.gpu-batched-whole.keep_records=whole-option.parquet",
          "--work-dir", str(tmp_path / "work")])  # fmt: skip

    result = json.loads((tmp_path / "beauty-metadata.json").read_text())
    assert set(result["category_accuracy"]) == {"gpu-batched", "gpu-batched-whole"}  # the runs that kept records
    gpu = result["category_accuracy"]["gpu-batched"]
    counts = {k: gpu[k] for k in ("catalogue_items", "scored", "failed", "not_asked", "records_not_in_truth")}
    assert counts == {"catalogue_items": 5, "scored": 3, "failed": 1, "not_asked": 1, "records_not_in_truth": 0}
    accuracy = {name: (a["value"], a["items"]) for name, a in gpu["accuracy"].items()}
    assert accuracy["top_level"] == (0.6667, 3)
    assert accuracy["level_2"] == (0.3333, 3)
    assert (accuracy["leaf"], accuracy["level_4"]) == ((0.0, 3), (0.0, 3))
    assert all(len(a["interval"]) == 2 for a in gpu["accuracy"].values())
    assert gpu["predicted"]["most_common"][0] == ["Beauty > Skin Care", 0.3333]
    assert gpu["true"]["distinct"] == 3
    assert gpu["answer_vs_truth"][0] == {"answer": "Beauty > Skin Care", "truth": "Beauty > Skin Care", "share": 0.3333}
    assert result["category_accuracy"]["gpu-batched-whole"]["accuracy"]["level_2"]["value"] == 1.0
    (pair,) = result["category_pairs"]  # the config's pair whose two runs kept records
    assert (pair["a"], pair["b"], pair["items"]) == ("gpu-batched-whole", "gpu-batched", 2)  # A1, A2: valid in both
    assert {level: (v["a"], v["b"], v["difference"]) for level, v in pair["levels"].items()} == {
        "level_1": (1.0, 1.0, 0.0), "level_2": (1.0, 0.5, 0.5)
    }  # fmt: skip
    assert result["reproduce"]["overrides"]["only"] == []
