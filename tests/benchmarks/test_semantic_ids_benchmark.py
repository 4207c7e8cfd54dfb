"""The semantic-ID benchmark on the synthetic data with a tiny RQ-KMeans `sid` section: encoder throughput and the
health of the built IDs, keyed by the experiment config's name; the result reproduces from its config."""

from __future__ import annotations

import json
from pathlib import Path

import benchmarks.semantic_ids as semantic_ids
from benchmarks.reproduce import problems_of

EXPERIMENT = (
    "{data.options.num_users: 300, data.options.num_items: 150, content.text_fields: [title], "
    "sid: {method: rqkmeans, rqkmeans: {levels: 2, codebook_size: 8}}}"
)


def test_throughput_and_health_of_each_config(tmp_path: Path) -> None:
    args = ["--set", "configs=[configs/synthetic/sasrec.yaml]", "--set", "data_path=null",
            "--set", f"experiment={EXPERIMENT}", "--work-dir", str(tmp_path / "work"),
            "--results-dir", str(tmp_path)]  # fmt: skip
    path = semantic_ids.main(args)
    result = json.loads(path.read_text())
    assert path.name == "synthetic-semantic-ids.json"
    assert result["dataset"] == {"name": "synthetic", "options": {"num_users": 300, "num_items": 150}, "items": 150}
    throughput = result["embedding_throughput"]
    assert throughput["items"] == 150 and throughput["items_per_second"] > 0
    health = result["tokenizers"]["synthetic-sasrec"]  # the config's name
    assert health["num_items"] == 150 and health["levels"] == 2 and len(health["utilisation"]) == 2
    assert 0.0 <= health["collision_rate"] <= 1.0 and health["build"]["method"] == "rqkmeans"
    assert result["reproduce"]["benchmark"] == "benchmarks.semantic_ids"
    assert result["reproduce"]["config"] == "benchmarks/configs/semantic-ids.yaml"
    assert result["reproduce"]["overrides"]["configs"] == ["configs/synthetic/sasrec.yaml"]
    assert problems_of(path) == []
