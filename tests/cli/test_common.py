"""`recsys` on a config error: exit code 2, the file and the key named with a fix, no traceback, and at once from the
installed console script (the config is checked before the heavy imports: MLflow, torchrec)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app

RECSYS = Path(sys.executable).parent / "recsys"
# Imported only once a config is good; on a busy machine a wall-clock bound would fail for the wrong reason, so the
# test reads what the interpreter imported (PYTHONPROFILEIMPORTTIME) instead.
HEAVY_MODULES = ("mlflow", "torchrec")

BAD_PARAM = "model:\n  name: sasrec\n  params: {dim: 64, bogus: 1}\n"


@pytest.mark.parametrize(
    ("command", "text", "message"),
    [
        (["train"], None, "{config}: config file not found. Fix: pass an existing YAML file"),
        (["pipeline", "run"], None, "{config}: config file not found. Fix: pass an existing YAML file"),
        (["train"], BAD_PARAM, "{config}: model 'sasrec': model.params.bogus: unknown key (known: max_history,"),
        (["train"], BAD_PARAM.encode("utf-16"), "{config}: not UTF-8 text: it looks like UTF-16"),
        (["train"], BAD_PARAM + "model: {name: popularity}\n", "{config}: key 'model' is given twice (lines 1 and 4)"),
    ],
    ids=["train-missing", "pipeline-missing", "train-unknown-param", "train-utf16", "train-key-twice"],
)
def test_a_config_error_exits_2_at_once(
    tmp_path: Path, command: list[str], text: str | bytes | None, message: str
) -> None:
    config = tmp_path / "experiment.yaml"
    if text is not None:
        config.write_bytes(text if isinstance(text, bytes) else text.encode())
    result = subprocess.run(
        [str(RECSYS), *command, "--config", str(config), "--work-dir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"},
    )
    imported, stderr = _split_import_log(result.stderr)
    assert result.returncode == 2, stderr
    assert stderr.startswith("error: " + message.format(config=config)), stderr
    assert "Fix: " in stderr and "Traceback" not in stderr
    assert not (tmp_path / "work").exists()  # nothing was prepared
    assert "pipelines.config" in imported  # the log is read: the module that loads the config shows in it
    assert not [name for name in imported if name.split(".")[0] in HEAVY_MODULES]


def _split_import_log(stderr: str) -> tuple[set[str], str]:
    """The modules named by `-X importtime` lines, and the rest of stderr."""
    imported, rest = set(), []
    for line in stderr.splitlines(keepends=True):
        if line.startswith("import time:"):
            imported.add(line.rsplit("|", 1)[-1].strip())
        else:
            rest.append(line)
    return imported, "".join(rest)


HUGE = "9" * 5000  # past Python's 4,300-digit limit on reading an integer


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["name=../../esc"], "{config}: name: '../../esc' is not a valid name (it becomes a directory name"),
        (["name=a/b"], "{config}: name: 'a/b' is not a valid name"),
        (["name=a\\b"], "{config}: name: 'a\\\\b' is not a valid name"),
        (['name="a\\0b"'], "{config}: name: 'a\\x00b' is not a valid name"),
        (["name=.hidden"], "{config}: name: '.hidden' is not a valid name"),
        (["name={tmp}/abs"], "{config}: name: '/"),  # '/tmp/...'... (its length): shown cut when long
        (['name=""'], "{config}: name: '' is not a valid name"),
        (
            [f"name={'n' * 101}"],
            "{config}: name: '" + "n" * 40 + "'... (101 characters) is not a valid",
        ),
        (["model.name.x=1"], "model.name.x: model.name is 'sasrec', not a mapping, so it has no key 'x'. Fix: set"),
        (
            [f"model.params.dim={HUGE}"],
            "--set model.params.dim: the number on line 1 (" + "9" * 20 + "...",
        ),
        ([f"train.optimization.lr={HUGE}.0"], "--set train.optimization.lr: the number on line 1 ("),
    ],
    ids=[
        "dotdot",
        "slash",
        "backslash",
        "nul",
        "dot",
        "absolute",
        "empty",
        "long",
        "under-a-string",
        "huge-int",
        "huge-float",
    ],
)
def test_a_bad_override_exits_2_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_config: Callable[..., Path], sets: list[str], message: str
) -> None:
    """A name that is a path (it would put the prepared data and state.json outside the work dir), a key under a value
    that is not a mapping, a number past int64 or past the largest float: refused when the config loads. In process
    (the console script's own path is the test above's)."""
    config = tiny_config(tmp_path)
    work = tmp_path / "deep" / "work"
    options = [item for value in sets for item in ("--set", value.format(tmp=tmp_path))]
    monkeypatch.chdir(tmp_path)  # nothing is written beside the config either
    result = CliRunner().invoke(app, ["train", "--config", str(config), "--work-dir", str(work), *options])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: " + message.format(config=config, tmp=tmp_path)), result.stderr
    assert ("Fix: " in result.stderr and result.exception is None) or isinstance(result.exception, SystemExit)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"]  # no work dir, nothing beside it


def test_a_config_file_with_a_huge_number_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "experiment.yaml"
    config.write_text(f"model:\n  name: sasrec\n  params: {{dim: {HUGE}}}\n")
    result = CliRunner().invoke(app, ["train", "--config", str(config), "--work-dir", str(tmp_path / "work")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: {config}: the number on line 3 (99999999999999999999...9999999999, 5,000 "
                                    "characters) is too large"), result.stderr  # fmt: skip
    assert isinstance(result.exception, SystemExit) and not (tmp_path / "work").exists()
