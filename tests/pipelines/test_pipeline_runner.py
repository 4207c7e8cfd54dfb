"""`recsys pipeline run` against a real MLflow SQLite store and registry: steps, skips, resume, stopping after a
step (the champion gate: test_champion_gate.py; the lock and crash recovery: test_work_dir_lock.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

import pipelines.index
import pipelines.runner as runner
import pipelines.steps as steps
from cli import app
from pipelines.config import load_config
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.registry import CHAMPION
from recsys.enrich.columns import with_item_metadata
from recsys.errors import ConfigError, RecsysError
from recsys.models.registry import load_model
from recsys.semantic_ids.content import item_texts
from tests.chat_server import ChatServer


def statuses(run: tuple[steps.PipelineOutputs, list[runner.StepReport]]) -> dict[str, str]:
    return {r.name: r.status for r in run[1]}


def test_pipeline_runs_every_step_then_skips_them(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    config = load_config(tiny_config(tmp_path, pipeline={"index": {"kind": "flat"}}))
    first = runner.run_pipeline(config, tmp_path)
    assert statuses(first) == {
        "prepare_data": "ran", "enrich_items": "not applicable", "embed_content": "not applicable",
        "build_semantic_ids": "not applicable", "train_retriever": "ran", "build_index": "ran", "evaluate": "ran",
        "register": "ran",
    }  # fmt: skip
    outputs = first[0]
    assert outputs.index is not None and outputs.index.recall == 1.0  # a flat index is exact
    assert outputs.registration is not None and outputs.model is not None and outputs.evaluation is not None
    assert outputs.registration.decision.promoted and outputs.registration.decision.version == "1"
    bundle = Bundle(outputs.registration.bundle_dir)
    assert bundle.index_dir is not None and bundle.model_dir.is_dir() and bundle.catalogue_file.is_file()

    second = runner.run_pipeline(config, tmp_path)
    assert set(statuses(second).values()) == {"skipped", "not applicable"}

    uri = config.tracking.resolved_uri()
    client = MlflowClient(uri)
    champion = client.get_model_version_by_alias(config.registered_model_name, CHAMPION)
    assert str(champion.version) == "1" and champion.tags["gate.promoted"] == "True"
    experiment = client.get_experiment_by_name(config.experiment_name)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.info.run_name == "pipeline tiny-sasrec"]
    assert len(parents) == 2
    children = [
        {r.info.run_name for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
        for parent in parents
    ]  # the first run's steps are nested runs; the second ran none
    assert sorted(children, key=len) == [
        set(), {"prepare_data", "tiny-sasrec", "build_index", "evaluate", "register tiny-sasrec"}
    ]  # fmt: skip

    # the evaluate step's run: slice metrics (MLflow-safe names), the test metrics' interval bounds, and
    # evaluation.json + dashboard.html + per_user.npz as artifacts
    (evaluate,) = [r for r in runs if r.info.run_name == "evaluate"]
    assert evaluate.info.run_id == outputs.evaluation.run_id
    metrics = evaluate.data.metrics
    assert {"slice.popularity_decile_10.ndcg_at_10", "slice.history_length_21plus.users", "test.recall_at_10"} <= set(
        metrics
    )
    assert metrics["test.ndcg_at_10"] == pytest.approx(outputs.model.metrics["test"]["ndcg@10"])
    assert metrics["test.ndcg_at_10.low"] <= metrics["test.ndcg_at_10"] <= metrics["test.ndcg_at_10.high"]
    artifacts = {a.path for a in client.list_artifacts(evaluate.info.run_id, "evaluation")}
    assert artifacts == {"evaluation/evaluation.json", "evaluation/dashboard.html", "evaluation/per_user.npz"}


def test_a_crashed_run_resumes_at_the_failed_step(
    tmp_path: Path, tiny_config: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(tiny_config(tmp_path, tracking={"enabled": False}, pipeline={"index": {"kind": "flat"}}))

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    with monkeypatch.context() as patched:
        patched.setattr(pipelines.index, "build_index_step", crash)  # the runner imports it on use
        with pytest.raises(RuntimeError, match="disk full"):
            runner.run_pipeline(config, tmp_path)
    state = json.loads((tmp_path / "pipelines" / "tiny-sasrec" / "state.json").read_text())
    assert set(state) == {"prepare_data", "train_retriever"}
    assert not (tmp_path / "pipelines" / "tiny-sasrec" / "lock").exists()  # let go: nothing that looks stale
    resumed = statuses(runner.run_pipeline(config, tmp_path))
    assert resumed["prepare_data"] == resumed["train_retriever"] == "skipped" and resumed["build_index"] == "ran"
    assert resumed["register"] == "not applicable"  # tracking off: no registry

    changed = load_config(tiny_config(tmp_path, tracking={"enabled": False}, pipeline={"index": {"kind": "hnsw"}}))
    again = statuses(runner.run_pipeline(changed, tmp_path))
    assert again["train_retriever"] == "skipped" and again["build_index"] == "ran"


def test_a_source_without_its_path_names_the_config_key_and_leaves_no_lock(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    config = load_config(tiny_config(tmp_path, data={"source": "amazon-p5", "options": {}}))
    with pytest.raises(ConfigError, match=r"source 'amazon-p5' needs an input path. Fix: data.path"):
        runner.run_pipeline(config, tmp_path)
    assert not (tmp_path / "pipelines" / "tiny-sasrec" / "lock").exists()


def test_a_model_built_on_one_not_trained_yet_fails_before_anything_is_written(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    """A ranker whose retriever is not trained fails at once, naming the key and the fix, with nothing under the work
    dir (not after preparing its data); a run that stops before training does not need the retriever."""
    missing = tmp_path / "models" / "not-trained"
    model = {"name": "ranker", "upstream": {"retriever": str(missing)}, "params": {"dim": 8, "hidden": 8}}
    config = load_config(tiny_config(tmp_path, name="tiny-ranker", model=model, tracking={"enabled": False}))
    work = tmp_path / "work"
    named = rf"model.upstream.retriever: {re.escape(str(missing))} is not a model directory .*Fix: train that model"
    for options in ({}, {"only": "train_retriever"}, {"until": "evaluate"}):
        with pytest.raises(RecsysError, match=named):
            runner.run_pipeline(config, work, **options)
        assert not work.exists()
    assert statuses(runner.run_pipeline(config, work, until="prepare_data")) == {"prepare_data": "ran"}


def test_cli_prints_the_steps(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    path = tiny_config(tmp_path, tracking={"enabled": False})
    result = CliRunner().invoke(app, ["pipeline", "run", "--config", str(path), "--work-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for step in steps.STEP_NAMES:
        assert step in result.output
    assert "not applicable" in result.output and "recall@k=" in result.output


def test_single_step_needs_its_upstream_steps(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    config = load_config(tiny_config(tmp_path, tracking={"enabled": False}, pipeline={"index": {"kind": "flat"}}))
    with pytest.raises(RecsysError, match="unknown pipeline step 'deploy'"):
        runner.run_pipeline(config, tmp_path, only="deploy")
    with pytest.raises(RecsysError, match="step prepare_data is not up to date"):
        runner.run_pipeline(config, tmp_path, only="train_retriever")
    assert statuses(runner.run_pipeline(config, tmp_path, only="prepare_data")) == {"prepare_data": "ran"}
    ran = statuses(runner.run_pipeline(config, tmp_path, only="train_retriever"))
    assert ran == {
        "prepare_data": "skipped", "enrich_items": "not applicable", "embed_content": "not applicable",
        "build_semantic_ids": "not applicable", "train_retriever": "ran",
    }  # fmt: skip


def test_a_model_reading_content_embeddings_gets_them_from_the_pipeline(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    sid = {"method": "rqkmeans", "rqkmeans": {"levels": 2, "codebook_size": 8}}
    model = {"name": "two_tower", "params": {"max_history": 20, "dim": 16, "hidden_dim": 32, "use_content": True}}
    config = load_config(
        tiny_config(tmp_path, name="tiny-content", sid=sid, model=model, train={"schedule": {"epochs": 1}})
    )
    outputs, _ = runner.run_pipeline(config, tmp_path)
    assert outputs.model is not None and outputs.content is not None
    _, trained = load_model(outputs.model.model_dir / "model.pt")
    content = np.load(outputs.content.path)
    assert trained.config.content_dim == content.shape[1] > 0  # the item tower reads the embed_content step's output


def test_stopping_after_a_step_on_given_data_and_running_a_step_again(
    tmp_path: Path, tiny_config: Callable[..., Path], tiny_data_dir: Path
) -> None:
    config = load_config(tiny_config(tmp_path, tracking={"enabled": False}))
    until_train = runner.run_pipeline(config, tmp_path, until="train_retriever", data_dir=tiny_data_dir)
    assert list(statuses(until_train).values()) == [
        "given",
        "not applicable",
        "not applicable",
        "not applicable",
        "ran",
    ]
    assert until_train[0].model is not None and until_train[0].index is None
    assert statuses(runner.run_pipeline(config, tmp_path, until="train_retriever", data_dir=tiny_data_dir)) == {
        "prepare_data": "given", "enrich_items": "not applicable", "embed_content": "not applicable",
        "build_semantic_ids": "not applicable", "train_retriever": "skipped",
    }  # fmt: skip
    again = runner.run_pipeline(config, tmp_path, until="train_retriever", data_dir=tiny_data_dir,
                                rerun=["train_retriever"])  # fmt: skip
    assert statuses(again)["train_retriever"] == "ran"


def test_new_data_retrains_what_depends_on_it(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    config = load_config(tiny_config(tmp_path, tracking={"enabled": False}, train={"schedule": {"epochs": 1}}))
    runner.run_pipeline(config, tmp_path, until="train_retriever")
    reseeded = load_config(tiny_config(tmp_path, tracking={"enabled": False}, train={"schedule": {"epochs": 1}},
                                       data={"seed": 1, "cold_start_fraction": 0.1}))  # fmt: skip
    ran = statuses(runner.run_pipeline(reseeded, tmp_path, until="train_retriever"))
    assert ran["prepare_data"] == ran["train_retriever"] == "ran"  # the same path, other contents


def test_how_training_reads_the_rows_does_not_prepare_the_data_again(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    config = load_config(tiny_config(tmp_path, tracking={"enabled": False}, train={"schedule": {"epochs": 1}}))
    assert statuses(runner.run_pipeline(config, tmp_path, until="prepare_data")) == {"prepare_data": "ran"}
    streamed = load_config(tiny_config(tmp_path, tracking={"enabled": False}, train={"schedule": {"epochs": 1},
                                                                                     "stream_parts": 2}))  # fmt: skip
    ran = statuses(runner.run_pipeline(streamed, tmp_path, until="train_retriever"))
    assert ran["prepare_data"] == "skipped" and ran["train_retriever"] == "ran"  # a training setting: training re-runs
    budget = load_config(tiny_config(tmp_path, tracking={"enabled": False}, data={"memory_budget_gb": 2.0}))
    assert statuses(runner.run_pipeline(budget, tmp_path, until="prepare_data")) == {"prepare_data": "skipped"}
    fewer = load_config(tiny_config(tmp_path, tracking={"enabled": False}, data={"min_interactions": 5}))
    assert statuses(runner.run_pipeline(fewer, tmp_path, until="prepare_data")) == {"prepare_data": "ran"}


def test_llm_metadata_is_a_step_whose_columns_the_content_text_reads(
    tmp_path: Path, tiny_config: Callable[..., Path], chat_server: ChatServer
) -> None:
    sid = {"method": "rqkmeans", "rqkmeans": {"levels": 2, "codebook_size": 8}}
    model = {"name": "two_tower", "params": {"max_history": 20, "dim": 16, "hidden_dim": 32, "use_content": True}}
    enrich = {"backend": "http", "model": "test-model", "url": chat_server.url, "batch_size": 16}
    content = {"text_fields": ["title", "llm_keywords", "llm_description"]}
    path = tiny_config(tmp_path, name="tiny-metadata", sid=sid, model=model, enrich=enrich, content=content,
                       train={"schedule": {"epochs": 1}})  # fmt: skip
    outputs, reports = runner.run_pipeline(load_config(path), tmp_path, until="evaluate")
    assert statuses((outputs, reports))["enrich_items"] == "ran" and outputs.metadata is not None
    items = pl.read_parquet(outputs.data.data_dir / "items.parquet") if outputs.data else None
    assert items is not None
    joined = with_item_metadata(items, outputs.metadata.path)
    assert joined["llm_keywords"].null_count() == 0  # the scripted server answers every title
    texts = item_texts(joined.sort("item_idx"), content["text_fields"])
    assert all("; llm keywords: " in text and "; llm description: " in text for text in texts)
    report = json.loads((outputs.evaluation.evaluation_dir / "evaluation.json").read_text())  # type: ignore[union-attr]
    assert report["item_metadata"]["ok"] == items.height and report["item_metadata"]["coverage"] == 1.0
    asked = sum(chat_server.asked.values())

    faster = load_config(path, {"enrich.batch_size": 4})  # how it runs, not what it writes
    ran = statuses(runner.run_pipeline(faster, tmp_path, until="embed_content"))
    assert ran["enrich_items"] == "skipped" and sum(chat_server.asked.values()) == asked
    title_only = load_config(path, {"name": "tiny-title-only", "content.text_fields": ["title"]})
    baseline, _ = runner.run_pipeline(title_only, tmp_path, until="evaluate")
    assert baseline.evaluation is not None

    # the guard: the evaluate step measures the consumer against its title-only twin on the same users
    guarded = load_config(path, {"pipeline.compare_with": str(baseline.evaluation.evaluation_dir),
                                 "eval.uncertainty.resamples": 200})  # fmt: skip
    ran = statuses(runner.run_pipeline(guarded, tmp_path, until="evaluate"))
    assert ran["train_retriever"] == "skipped" and ran["evaluate"] == "ran"  # a comparison retrains nothing
    report = json.loads((outputs.evaluation.evaluation_dir / "evaluation.json").read_text())  # type: ignore[union-attr]
    ndcg = report["baseline"]["overall"]["ndcg@10"]
    assert report["baseline"]["champion"] == "tiny-title-only" and ndcg["low"] <= ndcg["difference"] <= ndcg["high"]
    assert {entry["slice"] for entry in report["baseline"]["slices"]["cold_start"]} == {"warm", "cold"}
    nowhere = load_config(path, {"pipeline.compare_with": str(tmp_path / "nowhere")})
    with pytest.raises(ConfigError, match=r"nowhere holds no evaluation .* Fix: run the baseline's pipeline"):
        runner.run_pipeline(nowhere, tmp_path, until="evaluate")


def test_the_runner_names_no_step() -> None:
    """What the runner does differently for a step, the step declares (`pipelines.steps.base.Step`)."""
    source = Path(runner.__file__).read_text()
    assert [name for name in steps.STEP_NAMES if name in source] == []


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),  # a disk that filled up under it
        lambda p: p.write_bytes(b"\x00" * 64),  # not JSON
        lambda p: p.write_text("[]"),  # a JSON list
        lambda p: p.write_text(json.dumps({"prepare_data": "ran"})),  # a step's record not an object
        lambda p: p.write_text(json.dumps({"prepare_data": {"outputs": {}}})),  # a record without its fingerprint
    ],
)
def test_a_state_file_that_does_not_read_reruns_the_steps_and_is_rewritten(
    tmp_path: Path,
    tiny_config: Callable[..., Path],
    corrupt: Callable[[Path], object],
) -> None:
    config = load_config(tiny_config(tmp_path, tracking={"enabled": False}))
    runner.run_pipeline(config, tmp_path, until="prepare_data")
    state_file = tmp_path / "pipelines" / "tiny-sasrec" / "state.json"
    corrupt(state_file)
    again = statuses(runner.run_pipeline(config, tmp_path, until="prepare_data"))
    assert again["prepare_data"] == "ran"  # not a traceback, nor blocked: the next run runs the step
    assert "prepare_data" in json.loads(state_file.read_text())  # the state is whole again
    assert statuses(runner.run_pipeline(config, tmp_path, until="prepare_data"))["prepare_data"] == "skipped"
