"""Each step's fingerprint for a few configs, against recorded values: a change to how a step's inputs are gathered (a
refactoring, a moved config key) must not change them, or every existing work dir would re-run its steps; a change
that does is made on purpose, and recorded here with its reason.

The outputs the steps hand on are made up (fixed paths and digests): only how each step turns the config and its
upstream outputs into its inputs is under test. Paths are relative to the test's directory, so they are the same on
every machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pipelines.config import ExperimentConfig, load_config
from pipelines.evaluate import EvaluateOutputs
from pipelines.steps import STEPS
from pipelines.steps.base import fingerprint
from pipelines.steps.outputs import (
    ContentEmbeddings,
    IndexOutputs,
    ItemMetadata,
    PipelineOutputs,
    PreparedData,
    SemanticIds,
)
from pipelines.train import TrainOutputs
from tests.conftest import write_tiny_config

# what each step hands on, made up; None: the step is the last one looked at (its outputs feed no fingerprint)
MADE_UP: dict[str, Any] = {
    "prepare_data": PreparedData(Path("data/x"), "1" * 64),
    "enrich_items": ItemMetadata(Path("metadata/x/item_metadata.parquet"), "2" * 64),
    "embed_content": ContentEmbeddings(Path("content/x/content_embeddings.npy"), None, "all-MiniLM-L6-v2"),
    "build_semantic_ids": SemanticIds(Path("sids/x/semantic_ids.parquet")),
    "train_retriever": TrainOutputs(Path("models/x"), "3" * 64, {"valid": {}, "test": {}}, None, True),
    "build_index": IndexOutputs(Path("indexes/x"), 0.99, 100),
    "evaluate": EvaluateOutputs(Path("evaluations/x"), {"ndcg@10": 0.1}, 20, None),
    "register": None,
}
QUERIES = Path("content/x/training_queries.npz")

TWO_TOWER_WITH_EVERYTHING = {
    "sid": {"method": "rqkmeans", "rqkmeans": {"levels": 2, "codebook_size": 8}},
    "model": {"name": "two_tower", "params": {"max_history": 20, "dim": 16, "hidden_dim": 32, "use_content": True}},
    "enrich": {"backend": "http", "model": "test-model", "url": "http://127.0.0.1:1/v1", "batch_size": 16},
    "content": {"text_fields": ["title", "llm_keywords", "llm_description"]},
    "pipeline": {"index": {"kind": "flat"}, "compare_with": "evaluations/other"},
}
QUERY_AWARE = {
    "model": {"name": "query_aware", "params": {"max_history": 20, "dim": 32, "num_heads": 1, "ffn_dim": 64},
              "training": {"query_rate": 0.5, "queries_per_item": 2}},
    "tracking": {"enabled": False},
}  # fmt: skip
SASREC_OFFLINE = {"tracking": {"enabled": False}}

# step -> sha256 of its inputs' JSON (None: not applicable), recorded on cb76f27; train_retriever's since the model
# section's one `upstream` mapping replaced its four upstream fields (2026-11-25: an older work dir trains once again);
# enrich_items' since the default prompt became item-metadata-v2 (2026-11-26: the category chosen by the whole
# option's likelihood, so an enrich step left at the default asks its items again)
RECORDED: dict[str, dict[str, str | None]] = {
    "two-tower": {
        "prepare_data": "fbad852f409712f672d992ddbba85dd4128c77bfef17744b2a4c1398a9bfeff9",
        "enrich_items": "4db47ca8dccaaaa9bb1fdb080a3de59da397e35aec626fba6a66bd52de3456b6",
        "embed_content": "3f86bad34d352a92c2eb29a17fdd6e50eeb78061b999c9f208ea9afb71fd68f6",
        "build_semantic_ids": "0e2d8c2d7f110e26f44ac87c17b76432a01bd7b92c652c93fe16530def6b1f36",
        "train_retriever": "dcdd57c46aa8273658a799fda9161a0492aa51909f5f40ed531c4109036125b7",
        "build_index": "f1a6e50f00c31cd99639bb2539f994f37687b657767b18baaaae484e156ef10a",
        "evaluate": "8b8db5e11c2cc1fc813f2d6a4a58824a035ef03b82dda9d2bd4c774fd9228d61",
        "register": "ae4ffa2189ecee6f8dc0d265e69f566541260d2581fe60f651650c84a9d19674",
    },
    "query-aware": {
        "prepare_data": "fbad852f409712f672d992ddbba85dd4128c77bfef17744b2a4c1398a9bfeff9",
        "enrich_items": None,
        "embed_content": "15d5f1af1e580e1304bc4f5cc9822781187b028cb361625f28ac22166070c6ec",
        "build_semantic_ids": None,
        "train_retriever": "b4a07817bce971a3da09b0bba9d0b1e2d9fc79e904264556ebe0ee20a7d36913",
        "build_index": "fe4006deb0a6ee1f8e8da168e7e834b1e3ba707afeb9092ad2c973f1449c2cf3",
        "evaluate": "418fa964c2e5dd92832c3107b7f1992ce8d4bc07c26eb363f291ca7498630ccb",
        "register": None,
    },
    "sasrec": {
        "prepare_data": "fbad852f409712f672d992ddbba85dd4128c77bfef17744b2a4c1398a9bfeff9",
        "enrich_items": None,
        "embed_content": None,
        "build_semantic_ids": None,
        "train_retriever": "e9c653f3b67899b62f47a37b6e1d2e01e1809bcb26a082c715f20fd9c6dd9d32",
        "build_index": "fe4006deb0a6ee1f8e8da168e7e834b1e3ba707afeb9092ad2c973f1449c2cf3",
        "evaluate": "b6d19f735c2f7a774cfedec1be5239a09a1038891929d0c8315a6450a91ece2c",
        "register": None,
    },
}


def step_fingerprints(config: ExperimentConfig) -> dict[str, str | None]:
    """Every step's fingerprint, each seeing the made-up outputs of the applicable steps before it (as the runner
    hands them on)."""
    done, found = PipelineOutputs(), {}
    for step in STEPS:
        inputs = step.inputs(config, done)
        found[step.name] = None if inputs is None else fingerprint(inputs)
        outputs = MADE_UP[step.name]
        if step.name == "embed_content" and inputs is not None and "training_queries" in inputs:
            outputs = ContentEmbeddings(outputs.path, QUERIES, outputs.encoder)
        setattr(done, step.field, None if inputs is None else outputs)
    return found


@pytest.mark.parametrize(
    "sections", [TWO_TOWER_WITH_EVERYTHING, QUERY_AWARE, SASREC_OFFLINE], ids=["two-tower", "query-aware", "sasrec"]
)
def test_every_step_keeps_its_recorded_fingerprint(
    sections: dict[str, Any], request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the made-up paths, relative, read from here
    for path, content in ((MADE_UP["embed_content"].path, b"vectors"), (QUERIES, b"queries")):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    config = load_config(write_tiny_config(tmp_path, **sections))
    found = step_fingerprints(config)
    assert found == RECORDED[request.node.callspec.id], json.dumps(found, indent=2)


def test_an_option_added_since_leaves_the_fingerprint_at_its_default_and_changes_it_when_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    clipped = {**SASREC_OFFLINE, "train": {"optimization": {"max_grad_norm": 1.0}}}
    found = step_fingerprints(load_config(write_tiny_config(tmp_path, **clipped)))
    recorded = RECORDED["sasrec"]
    assert found["prepare_data"] == recorded["prepare_data"]
    assert found["train_retriever"] != recorded["train_retriever"], "a set max_grad_norm left the trained model current"
