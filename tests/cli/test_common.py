"""The installed `recsys` console script on a config error: exit code 2, the file and the key named with a fix, no
traceback, and fast (the config is checked before the heavy imports: MLflow, torchrec)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

RECSYS = Path(sys.executable).parent / "recsys"
FAST_S = 10.0  # about 2 s on a 2-core machine (torch's import, mostly); minutes if the data were prepared first

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
    start = time.monotonic()
    result = subprocess.run(
        [str(RECSYS), *command, "--config", str(config), "--work-dir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.monotonic() - start
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: " + message.format(config=config)), result.stderr
    assert "Fix: " in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "work").exists()  # nothing was prepared
    assert seconds < FAST_S
