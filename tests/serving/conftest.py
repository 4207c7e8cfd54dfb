"""A registered bundle for the serving tests: one pipeline run into a real MLflow SQLite registry."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines.config import load_config
from pipelines.runner import run_pipeline


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> tuple[str, str, Path]:
    """(tracking URI, registered model name, data dir) after one pipeline run (champion = version 1)."""
    work = tmp_path_factory.mktemp("serving")
    config = load_config(tiny_config(work, pipeline={"index": {"kind": "flat"}}))
    reports = {r.name: r.outputs for r in run_pipeline(config, work)}
    return config.tracking.resolved_uri(), config.registered_model_name, Path(reports["prepare_data"]["data_dir"])
