"""benchmarks.gpu_tests runs pytest on the selected tests in a real child process and lists each with its result."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import gpu_tests
from benchmarks.common import REPO

CONFIG = REPO / "benchmarks/configs/gpu-tests.yaml"

TESTS = """
import time

import pytest


@pytest.mark.gpu
def test_passes():
    assert 1 + 1 == 2


@pytest.mark.gpu
def test_skips():
    pytest.skip("needs 2 CUDA devices, this machine has 0")


@pytest.mark.kernels
def test_fails():
    assert [1, 2] == [1, 3]


def test_not_selected():
    time.sleep(60)
"""


def _tests_in(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "selected"
    folder.mkdir()
    (folder / "test_selected.py").write_text(text)
    return folder


def test_every_selected_test_is_listed_with_its_outcome_and_message(tmp_path: Path) -> None:
    folder = _tests_in(tmp_path, TESTS)
    path = gpu_tests.main(["--config", str(CONFIG), "--set", f"paths=[{folder}]", "--set", "result_name=listed",
                           "--results-dir", str(tmp_path)])  # fmt: skip
    result = json.loads(path.read_text())

    by_name = {test["id"].rsplit("::", 1)[1]: test for test in result["tests"]}
    assert set(by_name) == {"test_passes", "test_skips", "test_fails"}  # the unmarked one deselected
    assert by_name["test_passes"]["outcome"] == "passed" and "message" not in by_name["test_passes"]
    assert by_name["test_skips"]["outcome"] == "skipped"
    assert "needs 2 CUDA devices" in by_name["test_skips"]["message"]
    assert by_name["test_fails"]["outcome"] == "failed" and "assert" in by_name["test_fails"]["message"]
    assert result["counts"] == {"failed": 1, "passed": 1, "skipped": 1}
    assert result["pytest_exit_code"] == 1 and result["ran_to_the_end"]
    assert result["reproduce"]["config"] == "benchmarks/configs/gpu-tests.yaml"


def test_a_run_past_its_limit_is_stopped_and_says_so(tmp_path: Path) -> None:
    folder = _tests_in(
        tmp_path, "import time\n\nimport pytest\n\n\n@pytest.mark.gpu\ndef test_slow():\n    time.sleep(60)\n"
    )
    path = gpu_tests.main(["--config", str(CONFIG), "--set", f"paths=[{folder}]", "--set", "timeout_s=5",
                           "--set", "result_name=stopped", "--results-dir", str(tmp_path)])  # fmt: skip
    result = json.loads(path.read_text())

    assert result["pytest_exit_code"] == -1 and not result["ran_to_the_end"]
    assert result["tests"] == []
