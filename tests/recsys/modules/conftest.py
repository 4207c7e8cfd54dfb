"""Fixtures of the item-representation tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from features.prepare import prepare
from features.settings import PrepareSettings
from features.sources import load_source
from recsys.data.prepared import SequenceData, load_prepared


@pytest.fixture(scope="module")
def cold_data(tmp_path_factory: pytest.TempPathFactory) -> SequenceData:
    out = tmp_path_factory.mktemp("cold") / "prepared"
    prepare(
        load_source("synthetic", None, num_users=400, num_items=150),
        out,
        PrepareSettings(cold_start_fraction=0.2, seed=3),
    )
    return load_prepared(Path(out))
