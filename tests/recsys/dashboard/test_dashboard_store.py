"""The dashboard read from a real MLflow store: two scheduled runs of one registered model (a drifting training seed)
give a trend of two evaluations and the newer one compared with the champion's user by user; and a store of 200 runs
is read and drawn within a bound that keeps the page usable."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines.config import load_config
from pipelines.runner import run_pipeline
from recsys.artifacts.registry import PARENT_TAG, PROMOTED_TAG
from recsys.dashboard import from_mlflow, render_dashboard

# a 200-run store is read (one search, no artifact downloads but the latest evaluations') and drawn well within this
# on a busy 2-core CI machine: measured 1.1 s here
SECONDS_AT_200_RUNS = 20.0


def test_two_scheduled_runs_give_a_trend_and_a_champion_comparison(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    path = tiny_config(tmp_path, pipeline={"index": {"kind": "flat"}})
    for seed in (0, 1):
        run_pipeline(load_config(path, {"train.seed": seed}), tmp_path)
    data = from_mlflow(f"sqlite:///{tmp_path / 'mlflow.db'}")

    assert len(data.trend) == 2 and data.trend[0].start_time < data.trend[1].start_time
    assert data.trend[0].promoted is True  # the first version is the first champion
    assert data.trend[1].promoted in (True, False)  # the gate decided on the second one
    assert all(p.interval is not None and p.interval[0] <= p.value <= p.interval[1] for p in data.trend)
    comparison = data.comparison
    assert comparison is not None, data.notes
    assert comparison["users"] > 0 and set(comparison["overall"]["ndcg@10"]) == {"difference", "low", "high",
                                                                                  "p_value"}  # fmt: skip
    newest = max(data.trend, key=lambda p: p.start_time)
    expected = newest.value - data.trend[0].value  # the newer evaluation minus the champion's, the same users
    assert comparison["overall"]["ndcg@10"]["difference"] == pytest.approx(expected, abs=1e-9)
    assert all(run.intervals.get("test/ndcg@10") for run in data.runs)  # each training run: its evaluation's interval
    html = render_dashboard(data)
    assert 'id="chart-champion"' in html and 'id="chart-trend"' in html


def test_a_store_of_200_runs_is_read_and_drawn_quickly(tmp_path: Path) -> None:
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("daily")
    millis = int(time.time() * 1000)
    for day in range(50):  # 50 scheduled pipeline runs of 4 runs each: the pipeline, train, evaluate, register
        parent = client.create_run(experiment, run_name="sasrec-daily").info.run_id
        nested = [RunTag(PARENT_TAG, parent)]
        steps = {
            "sasrec-daily": ([Metric("valid_ndcg_at_10", 0.05, millis, 0), Metric("test_ndcg_at_10", 0.04, millis, 0),
                              Metric("best_epoch", 7, millis, 0)], [Param("model.name", "sasrec")], []),
            "evaluate": ([Metric("test.ndcg_at_10", 0.04 + day / 1e4, millis, 0),
                          Metric("test.ndcg_at_10.low", 0.038, millis, 0),
                          Metric("test.ndcg_at_10.high", 0.045, millis, 0)], [], []),
            "register sasrec-daily": ([], [], [RunTag(PROMOTED_TAG, str(day % 7 == 0))]),
        }  # fmt: skip
        for name, (metrics, params, tags) in steps.items():
            run_id = client.create_run(experiment, run_name=name).info.run_id
            client.log_batch(run_id, metrics=metrics, params=params, tags=nested + tags)
            client.set_terminated(run_id)
        client.set_terminated(parent)

    start = time.perf_counter()
    data = from_mlflow(uri)
    html = render_dashboard(data)
    seconds = time.perf_counter() - start

    assert len(data.runs) == 50 and len(data.trend) == 50 and sum(bool(p.promoted) for p in data.trend) == 8
    assert 'id="chart-trend"' in html
    print(f"200 runs: read and drawn in {seconds:.2f} s")  # noqa: T201
    assert seconds < SECONDS_AT_200_RUNS, seconds


@pytest.mark.parametrize(("report", "says"), [("[1, 2]", "holds a JSON list"), ('{"name": "x", "us', "cut short")])
def test_an_evaluation_report_that_does_not_read_costs_its_section_not_the_page(
    tmp_path: Path, report: str, says: str
) -> None:
    from mlflow.tracking import MlflowClient

    from recsys.artifacts.evaluation_dir import EVALUATE_RUN_NAME, EVALUATION_ARTIFACT

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("daily", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(experiment, run_name=EVALUATE_RUN_NAME).info.run_id
    client.log_text(run_id, report, EVALUATION_ARTIFACT)
    client.set_terminated(run_id)
    data = from_mlflow(uri)
    assert data.evaluations == [] and any(says in note and run_id in note for note in data.notes), data.notes
    assert "<html" in render_dashboard(data)
