"""Every committed result names a config in the repo that reproduces it, and the check finds a result that does not."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from benchmarks.common import REPO, Reproduce, reproduce_of
from benchmarks.reproduce import main, problems_of

SASREC = "configs/beauty/sasrec.yaml"


def test_every_committed_result_reproduces_from_a_config_in_the_repo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--check"]) == 0, capsys.readouterr().out


def result_of(tmp_path: Path, **fields: object) -> Path:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(fields))
    return path


def test_the_check_names_what_keeps_a_result_from_being_reproduced(tmp_path: Path) -> None:
    # a result recorded before train.lr became train.optimization.lr checks under the new name
    record = {"benchmark": "benchmarks.quality", "config": SASREC, "overrides": {"train.lr": 0.01}}
    good = {"settings": {"model": {"params": {"dim": 64}}, "train": {"lr": 0.01}}, "reproduce": record}
    assert problems_of(result_of(tmp_path, **good)) == []
    assert problems_of(result_of(tmp_path)) == ["no `reproduce` record {benchmark, config, overrides}"]
    moved = {**good, "reproduce": {**record, "config": "configs/beauty-sasrec.yaml"}}
    assert problems_of(result_of(tmp_path, **moved)) == ["config configs/beauty-sasrec.yaml is not in the repo"]
    drifted = {**good, "reproduce": {**record, "overrides": {}}}  # the recorded lr is not the config's
    assert problems_of(result_of(tmp_path, **drifted)) == [
        "settings train.optimization.lr: the result has 0.01, the config 0.001"
    ]
    typo = {**good, "reproduce": {**record, "overrides": {"train.lrr": 0.01}}}
    assert "does not load" in problems_of(result_of(tmp_path, **typo))[0]


def test_a_result_needs_a_config_in_the_repo(tmp_path: Path) -> None:
    outside = tmp_path / "mine.yaml"
    outside.write_text("train: {schedule: {epochs: 1}}\n")
    with pytest.raises(SystemExit, match="not a file in the repo"):
        reproduce_of("benchmarks.quality", Namespace(config=outside, set=[]))
    args = Namespace(config=REPO / SASREC, set=["model.upstream.members=[a, b]"])
    record = reproduce_of("benchmarks.quality", args, {"train.hardware.device": "cuda"})
    expected = {"train.hardware.device": "cuda", "model.upstream.members": ["a", "b"]}
    assert record == Reproduce("benchmarks.quality", SASREC, expected)
    assert record.command() == (
        f".venv/bin/python -m benchmarks.quality --config {SASREC} --set train.hardware.device=cuda "
        "--set 'model.upstream.members=[a, b]'"
    )
