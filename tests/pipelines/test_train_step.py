"""The training pipeline against a real MLflow SQLite store."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import mlflow
import pytest
import torch

from pipelines.config import load_config
from pipelines.data import FINGERPRINT_FILE, data_fingerprint, prepare_step
from pipelines.train import CatalogFeatures, TrainOutputs, model_inputs
from recsys.artifacts.model_dir import load_model_dir
from recsys.data.prepared import load_prepared
from recsys.data.schema import META_FILE
from recsys.errors import ConfigError, DataError, RecsysError
from recsys.models.family import ModelInputs
from tests.conftest import train_experiment as train


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> tuple[Path, TrainOutputs]:
    work = tmp_path_factory.mktemp("train-step")
    return work, train(load_config(tiny_config(work)), work)


def test_model_dir_holds_model_metrics_and_id_maps(trained: tuple[Path, TrainOutputs]) -> None:
    work, _ = trained
    model_dir = work / "models" / "tiny-sasrec"
    names = {p.name for p in model_dir.iterdir()}
    assert {"model.pt", "config.yaml", "metrics.json", "items.parquet", "users.parquet", "data.json"} <= names
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert set(metrics["test"]) >= {"recall@10", "ndcg@10", "recall@50", "mrr", "coverage@10"}
    assert 1 <= metrics["best_epoch"] <= metrics["epochs_run"] <= 3
    assert metrics["seconds_per_epoch"] > 0


def test_reloaded_model_scores_like_the_reported_metrics(trained: tuple[Path, TrainOutputs]) -> None:
    from recsys.evaluation import EvalConfig, evaluate

    work, outputs = trained
    loaded = load_model_dir(work / "models" / "tiny-sasrec")
    result = evaluate(loaded.model, loaded.data.eval_split("test"), loaded.data.num_items, EvalConfig())
    assert result.metrics["ndcg@10"] == pytest.approx(outputs.metrics["test"]["ndcg@10"])


def test_mlflow_run_has_params_epoch_metrics_and_model(trained: tuple[Path, TrainOutputs]) -> None:
    work, outputs = trained
    mlflow.set_tracking_uri(f"sqlite:///{work / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    run = client.get_run(outputs.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["model.name"] == "sasrec"
    assert run.data.params["train.optimization.batch_size"] == "8"
    assert "test_ndcg_at_10" in run.data.metrics
    history = client.get_metric_history(run.info.run_id, "epoch_valid_ndcg_at_10")
    assert [m.step for m in history] == list(range(1, len(history) + 1))
    model = mlflow.pytorch.load_model(f"runs:/{run.info.run_id}/model")
    histories = torch.tensor([[0, 1, 2]])
    local = load_model_dir(work / "models" / "tiny-sasrec").model
    torch.testing.assert_close(model.score(histories), local.score(histories))


def test_prepare_step_skips_unchanged_inputs_and_redoes_changed_ones(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    config = load_config(tiny_config(tmp_path))
    out = tmp_path / "data"
    prepare_step(config.data, out)
    first = (out / "interactions.parquet").stat().st_mtime_ns
    prepare_step(config.data, out)
    assert (out / "interactions.parquet").stat().st_mtime_ns == first, "an up-to-date step ran again"
    prepare_step(config.data.model_copy(update={"memory_budget_gb": 1.0}), out)  # how the work is cut, not what
    assert (out / "interactions.parquet").stat().st_mtime_ns == first, "a new memory budget prepared again"
    changed = config.data.model_copy(update={"seed": 1})
    prepare_step(changed, out)
    assert (out / "interactions.parquet").stat().st_mtime_ns != first


# with the popularity correction, the model is built on the data's training counts and keeps them; with the retrieval
# head, its item vectors are saved and reloaded with the rest
@pytest.mark.parametrize(("popularity_correction", "retrieval_candidates"), [(0.0, 0), (0.5, 0), (0.0, 5)])
def test_generative_experiment_builds_ids_trains_saves_and_reloads(
    tmp_path: Path, tiny_config: Callable[..., Path], popularity_correction: float, retrieval_candidates: int
) -> None:
    sid = {"method": "rqkmeans", "rqkmeans": {"levels": 2, "codebook_size": 8}}
    model = {
        "name": "generative",
        "params": {"dim": 16, "num_heads": 2, "ffn_dim": 32, "num_encoder_layers": 1, "num_decoder_layers": 1,
                   "beam_size": 10, "popularity_correction": popularity_correction,
                   "retrieval_candidates": retrieval_candidates},
    }  # fmt: skip
    config = load_config(
        tiny_config(
            tmp_path, name="tiny-tiger", sid=sid, model=model, train={"schedule": {"epochs": 1}}, eval={"ks": [5, 10]}
        )
    )
    outputs = train(config, tmp_path)
    assert outputs.metrics["test"]["recall@10"] >= outputs.metrics["test"]["recall@5"]
    loaded = load_model_dir(tmp_path / "models" / "tiny-tiger")
    assert loaded.name == "generative"
    histories = torch.tensor([[0, 1, 2], [3, 4, 5]])
    items, _ = loaded.model.generate(histories)  # type: ignore[union-attr]
    assert items.shape == (2, 10) and bool((items > 0).all())
    if popularity_correction:
        (data_dir,) = (tmp_path / "data").iterdir()
        counts = load_prepared(data_dir).item_counts().float()
        assert torch.equal(loaded.model.item_weights, counts + 1)  # type: ignore[union-attr]
    else:
        assert not hasattr(loaded.model, "item_weights")
    assert hasattr(loaded.model, "retrieval_item_emb") == bool(retrieval_candidates)


@pytest.mark.parametrize("vectors", ["collaborative", "content_and_collaborative"])
def test_collaborative_semantic_ids_need_no_item_text(
    tmp_path: Path, tiny_config: Callable[..., Path], vectors: str
) -> None:
    """sid.vectors collaborative: no content step (nothing embeds text), codes from the training interactions; with
    the content too, the content step runs."""
    from pipelines.runner import run_pipeline
    from recsys.semantic_ids.codes import read_semantic_ids

    sid = {"method": "rqkmeans", "vectors": vectors, "collaborative": {"dim": 8},
           "rqkmeans": {"levels": 2, "codebook_size": 8}}  # fmt: skip
    model = {"name": "generative", "params": {"dim": 16, "num_heads": 2, "ffn_dim": 32, "num_encoder_layers": 1,
                                              "num_decoder_layers": 1, "beam_size": 10}}  # fmt: skip
    settings = {"train": {"schedule": {"epochs": 1}}, "eval": {"ks": [5, 10]}, "tracking": {"enabled": False}}
    config = load_config(tiny_config(tmp_path, name="tiny-cf-tiger", sid=sid, model=model, **settings))
    outputs, reports = run_pipeline(config, tmp_path, until="train_retriever")
    content_step = {r.name: r.status for r in reports}["embed_content"]
    assert (content_step == "not applicable") == (vectors == "collaborative")
    assert outputs.semantic_ids is not None and outputs.model is not None
    sids, stats = read_semantic_ids(outputs.semantic_ids.path)
    assert sids.meta["vectors"] == vectors and sids.codes.shape[1] == 3  # 2 levels + the de-dup level
    assert stats.to_dict()["utilisation"][0] > 0.5  # the first level's codes are used, not all items on one


def test_tracking_off_writes_the_model_dir_and_no_mlflow_store(
    tmp_path: Path, tiny_config: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(tiny_config(tmp_path, train={"schedule": {"epochs": 1}}, tracking={"enabled": False}))
    outputs = train(config, tmp_path)
    assert outputs.run_id is None
    assert (tmp_path / "models" / "tiny-sasrec" / "model.pt").is_file()
    assert not (tmp_path / "mlflow.db").exists()
    assert "MLflow tracking is off" in caplog.text


def test_each_evaluation_of_a_training_says_what_it_evaluates(
    tmp_path: Path, tiny_config: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(tiny_config(tmp_path, train={"schedule": {"epochs": 1}}, tracking={"enabled": False}))
    with caplog.at_level("INFO", logger="recsys.evaluation"):
        train(config, tmp_path)
    said = [r.getMessage() for r in caplog.records if r.name.startswith("recsys.evaluation")]  # not others' lines
    done = [m.partition(": done, ")[0] for m in said if ": done, " in m]
    assert done == [
        "evaluation of validation, epoch 1",
        "evaluation of sasrec on validation, best epoch 1",
        "evaluation of sasrec on test",
        "evaluation of the popularity baseline on validation",
    ]


def test_the_initial_weights_follow_the_seed_not_what_ran_before(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    """A run that prepared its data in the same process, or drew random numbers before, starts from the same
    weights: with one CPU thread (bit-reproducible training) the two models are identical."""
    overrides = {"train": {"schedule": {"epochs": 1}, "hardware": {"threads": 1}}, "tracking": {"enabled": False}}
    weights, threads = [], torch.get_num_threads()
    try:
        for draws in (0, 1000):
            torch.rand(draws)  # what an earlier step of the process may have drawn from the global generator
            work = tmp_path / f"after-{draws}"
            work.mkdir()
            outputs = train(load_config(tiny_config(work, **overrides)), work)
            weights.append(load_model_dir(outputs.model_dir).model.state_dict())
    finally:
        torch.set_num_threads(threads)  # train.hardware.threads sets the process's
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])


def test_a_model_is_built_on_what_its_family_reads_and_nothing_else(
    tmp_path: Path, tiny_config: Callable[..., Path], tiny_data_dir: Path
) -> None:
    data = load_prepared(tiny_data_dir)
    missing = tmp_path / "not-built"  # nothing is read from these paths unless the family reads them
    features = CatalogFeatures(semantic_ids=missing / "sids.parquet", content_embeddings=missing / "content.npy")
    sasrec = load_config(tiny_config(tmp_path))
    assert model_inputs(sasrec, data, features) == ModelInputs()
    with pytest.raises(ConfigError, match=r"model.upstream.retriever: model 'ranker' is built on the first stage"):
        load_config(tiny_config(tmp_path, model={"name": "ranker", "params": {}}))  # it names its first stage
    popularity = tiny_config(
        tmp_path, name="tiny-first", model={"name": "popularity", "params": {}}, tracking={"enabled": False}
    )
    first = train(load_config(popularity), tmp_path)
    ranker = {"name": "ranker", "params": {}, "upstream": {"retriever": str(first.model_dir)}}
    inputs = model_inputs(load_config(tiny_config(tmp_path, model=ranker)), data, features)
    assert inputs.tasks == data.tasks and inputs.content is None  # its tasks, no content (use_content false)
    assert inputs.retriever is not None and inputs.retriever.family == "popularity" and inputs.base is None
    with pytest.raises(RecsysError, match="no content embeddings"):  # two-tower with use_content reads them
        model_inputs(load_config(tiny_config(tmp_path, model={"name": "two_tower", "params": {"use_content": True}})),
                     data, features)  # fmt: skip


def test_a_content_first_model_trains_on_a_cold_split_and_reports_its_cold_slices(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    params = {"max_history": 20, "dim": 32, "num_heads": 1, "ffn_dim": 64, "content_first": True}
    config = load_config(
        tiny_config(
            tmp_path, name="tiny-content-first", model={"name": "sasrec", "params": params},
            data={"cold_start_fraction": 0.2, "seed": 1}, train={"schedule": {"epochs": 1}},
            tracking={"enabled": False},
        )
    )  # fmt: skip
    outputs = train(config, tmp_path)
    assert {"valid_cold", "valid_warm", "test_cold", "test_warm"} <= set(outputs.metrics)
    loaded = load_model_dir(outputs.model_dir)
    assert loaded.model.config.encoder == config.content.model  # new items are embedded as the catalogue was
    keep = loaded.model.content_items.keep_probability  # type: ignore[union-attr]
    assert float(keep[loaded.data.cold_mask].max()) == 0.0, "cold items have no residual: their content alone"
    assert float(keep[~loaded.data.cold_mask][1:].min()) > 0.0


@pytest.mark.parametrize(
    ("corrupt", "problem"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "it ends in the middle of a value"),
        (lambda p: p.write_bytes(b"\x89PNG"), "not UTF-8 text"),
    ],
)
def test_prepare_step_with_a_stored_fingerprint_that_does_not_read_prepares_again(
    tmp_path: Path, tiny_config: Callable[..., Path], caplog: pytest.LogCaptureFixture,
    corrupt: Callable[[Path], object], problem: str,
) -> None:  # fmt: skip
    config = load_config(tiny_config(tmp_path))
    out = tmp_path / "data"
    prepare_step(config.data, out)
    first = (out / "interactions.parquet").stat().st_mtime_ns
    corrupt(out / FINGERPRINT_FILE)
    prepare_step(config.data, out)  # no JSONDecodeError: the data is prepared again and the fingerprint rewritten
    assert (out / "interactions.parquet").stat().st_mtime_ns != first
    assert f"{out / FINGERPRINT_FILE}: " in caplog.text and problem in caplog.text
    assert json.loads((out / FINGERPRINT_FILE).read_text()) == data_fingerprint(config.data)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b'{"schema_version": 3, "counts": {"us', "not valid JSON: it ends in the middle of a value (cut short?)"),
        (b"[3]", "holds a JSON list, not the object expected"),
        (b"", "not valid JSON: it ends in the middle of a value (cut short?)"),
    ],
)
def test_a_prepared_meta_json_that_does_not_read_is_a_data_error_naming_it(
    tiny_data_dir: Path, tmp_path: Path, content: bytes, problem: str
) -> None:
    data_dir = Path(shutil.copytree(tiny_data_dir, tmp_path / "data"))
    (data_dir / META_FILE).write_bytes(content)
    with pytest.raises(DataError) as raised:
        load_prepared(data_dir)  # what every command reading prepared data calls
    assert str(raised.value).startswith(f"{data_dir / META_FILE}: {problem}. Fix: prepare it with `recsys data")
