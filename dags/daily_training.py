"""Airflow DAG `daily_training`: the platform's pipeline every day, one task per step.

No logic here: each task runs `pipelines.scheduling.run_step_task` (= `recsys pipeline run --step NAME`),
so up-to-date steps are skipped and a retried task resumes where the pipeline stopped; the train task runs on
`nproc_per_node` processes of the worker's host (= `--nproc-per-node N`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Param, chain, dag, task

from pipelines.scheduling import run_step_task
from pipelines.steps import STEP_NAMES


def _run(step: str, params: dict[str, Any] | None = None) -> dict[str, str]:
    assert params is not None  # Airflow passes the run's params
    return run_step_task(step, params)


@dag(
    dag_id="daily_training",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(hours=12),
    default_args={"retries": 2, "retry_delay": timedelta(minutes=10), "execution_timeout": timedelta(hours=6)},
    params={
        "config": Param("configs/synthetic/sasrec.yaml", type="string", description="experiment YAML"),
        "work_dir": Param("runs", type="string", description="where every step writes"),
        "nproc_per_node": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            description="processes of the worker's host that train (one per GPU, or CPU processes under gloo); "
            "empty: the config's train.distributed.nproc_per_node (1 by default)",
        ),
    },
    tags=["recsys", "training"],
)
def daily_training() -> None:
    chain(*[task(task_id=step)(_run)(step) for step in STEP_NAMES])


daily_training()
