"""The DAGs load without import errors and `daily_training` runs end to end with `dag.test()` (real Airflow 3,
SQLite metadata DB) on the tiny synthetic config, registering a champion in a real MLflow SQLite store."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from pipelines.scheduling import refresh_champion_index_task
from pipelines.steps import STEP_NAMES, TRAIN_STEP
from recsys.artifacts.model_dir import MODEL_FILE
from tests.dags.conftest import DAGS_FOLDER


def test_dagbag_loads_both_dags_without_errors(airflow_db: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert bag.import_errors == {}
    assert set(bag.dag_ids) == {"daily_training", "index_refresh"}
    daily = bag.get_dag("daily_training")
    assert [t.task_id for t in daily.topological_sort()] == STEP_NAMES
    assert all(t.retries == 2 and t.execution_timeout is not None for t in daily.tasks)
    assert bag.get_dag("index_refresh").get_task("refresh_champion_index").retries == 3


def test_daily_training_runs_end_to_end(airflow_db: Path, tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    from airflow.dag_processing.dagbag import DagBag

    config_path = tiny_config(tmp_path, pipeline={"index": {"kind": "flat"}})
    dag = DagBag(dag_folder=str(DAGS_FOLDER)).get_dag("daily_training")
    start = time.perf_counter()
    run = dag.test(run_conf={"config": str(config_path), "work_dir": str(tmp_path / "work")})
    seconds = time.perf_counter() - start
    assert str(run.state) in ("success", "DagRunState.SUCCESS"), run.state
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert set(states) == set(STEP_NAMES) and all(
        s in ("success", "TaskInstanceState.SUCCESS") for s in states.values()
    )

    tracking = yaml.safe_load(config_path.read_text())["tracking"]["uri"]
    champion = MlflowClient(tracking).get_model_version_by_alias("tiny-sasrec", "champion")
    assert str(champion.version) == "1"
    index_dir = refresh_champion_index_task({"config": str(config_path), "work_dir": str(tmp_path / "work")})
    assert (Path(index_dir) / "index.faiss").is_file()
    print(f"daily_training dag.test(): {seconds:.1f} s")  # noqa: T201  (the issue asks for its wall time)


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # pytest holds stderr: nothing to report
def test_daily_training_trains_on_two_processes(
    airflow_db: Path, tmp_path: Path, tiny_config: Callable[..., Path], capfd: pytest.CaptureFixture[str]
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    config_path = tiny_config(
        tmp_path, train={"schedule": {"epochs": 2}, "hardware": {"threads": 1}}, pipeline={"index": {"kind": "flat"}}
    )
    dag = DagBag(dag_folder=str(DAGS_FOLDER)).get_dag("daily_training")
    start = time.perf_counter()
    run = dag.test(run_conf={"config": str(config_path), "work_dir": str(tmp_path / "work"), "nproc_per_node": 2})
    seconds = time.perf_counter() - start
    _, logged = capfd.readouterr()  # the processes write to the task's stderr

    assert str(run.state) in ("success", "DagRunState.SUCCESS"), str(run.state) + logged
    assert "distributed: 2 processes, backend gloo" in logged  # rank 0 of the group the train task started
    assert f"[rank 0] pipelines.runner: step {TRAIN_STEP}: running" in logged  # the processes trained, not the task
    assert (tmp_path / "work" / "models" / "tiny-sasrec" / MODEL_FILE).is_file()
    print(f"daily_training dag.test() on 2 processes: {seconds:.1f} s")  # noqa: T201
