"""The laboratory's configs are frozen like the product's: experiments under benchmarks/configs/<dataset>/ load and
keep their names; every benchmark's settings are headed by their purpose, date and command."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.common import REPO
from tests.conftest import check_frozen_config

LAB_CONFIGS = REPO / "benchmarks" / "configs"
EXPERIMENTS = sorted(LAB_CONFIGS.glob("*/*.yaml"))
SETTINGS = sorted(LAB_CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_experiment_configs_load_and_state_their_purpose_date_and_command(path: Path) -> None:
    check_frozen_config(path)


@pytest.mark.parametrize("path", SETTINGS, ids=lambda p: p.name)
def test_benchmark_settings_state_their_purpose_date_and_command(path: Path) -> None:
    header = path.read_text().splitlines()[:8]
    for field in ("# Purpose:", "# Date:", "# Command"):  # "# Command (after ...):" where it has steps before it
        assert any(line.startswith(field) for line in header), f"{path.name} lacks '{field}'"
