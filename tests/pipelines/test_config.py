from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.config import load_config
from recsys.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_frozen_configs_load_and_state_their_purpose_date_and_command(path: Path) -> None:
    config = load_config(path)
    assert config.name == path.stem
    header = path.read_text().splitlines()[:8]
    for field in ("# Purpose:", "# Date:", "# Command:"):
        assert any(line.startswith(field) for line in header), f"{path.name} lacks '{field}'"


def test_unknown_key_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  epochz: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: train.epochz: Unexpected keyword argument"):
        load_config(path)


def test_wrong_type_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  lr: fast\n")
    with pytest.raises(ConfigError, match=r"train.lr: Input should be a valid number"):
        load_config(path)


def test_missing_file_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    path = tmp_path / "broken.yaml"
    path.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_overrides_apply_dotted_keys(tmp_path: Path) -> None:
    path = tmp_path / "x.yaml"
    path.write_text("train:\n  epochs: 3\n")
    config = load_config(path, {"train.epochs": 7, "data.path": "somewhere"})
    assert config.train.epochs == 7
    assert config.data.path == Path("somewhere")
    assert config.name == "x"
