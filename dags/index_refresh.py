"""Airflow DAG `index_refresh`: rebuild the FAISS index from the registered champion's item vectors, hourly.

No logic here: the task runs `pipelines.scheduling.refresh_champion_index_task`, which keeps an index that
is up to date with the champion (so an hour without a new champion costs one registry lookup).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Param, dag, task

from pipelines.scheduling import refresh_champion_index_task


@dag(
    dag_id="index_refresh",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 3, "retry_delay": timedelta(minutes=2), "execution_timeout": timedelta(minutes=30)},
    params={
        "config": Param("configs/synthetic/sasrec.yaml", type="string", description="experiment YAML"),
        "work_dir": Param("runs", type="string", description="the pipeline's work directory"),
    },
    tags=["recsys", "retrieval"],
)
def index_refresh() -> None:
    @task(task_id="refresh_champion_index")
    def refresh(params: dict[str, Any] | None = None) -> str:
        assert params is not None
        return refresh_champion_index_task(params)

    refresh()


index_refresh()
