"""Airflow for the DAG tests: a throw-away AIRFLOW_HOME with a SQLite metadata DB (`airflow db migrate` first).

Set at collection time, before anything imports `airflow` (it reads its configuration on import).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

DAGS_FOLDER = Path(__file__).resolve().parents[2] / "dags"
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="recsys-airflow-"))
os.environ.update(
    {
        "AIRFLOW_HOME": str(AIRFLOW_HOME),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
    }
)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """`airflow db migrate` once (SQLite in AIRFLOW_HOME)."""
    airflow = str(Path(sys.executable).with_name("airflow"))
    subprocess.run([airflow, "db", "migrate"], check=True, capture_output=True, env=os.environ.copy(), timeout=300)
    return AIRFLOW_HOME
