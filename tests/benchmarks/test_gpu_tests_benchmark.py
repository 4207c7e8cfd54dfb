"""benchmarks.gpu_tests runs pytest on the selected tests in a real child process and lists each with its result."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from benchmarks import gpu_tests
from benchmarks.common import REPO
from recsys.errors import ConfigError

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


def test_a_run_past_its_limit_is_interrupted_and_lists_the_tests_that_finished(tmp_path: Path) -> None:
    folder = _tests_in(
        tmp_path,
        "import time\n\nimport pytest\n\n\n@pytest.mark.gpu\ndef test_a_quick():\n    pass\n\n\n"
        "@pytest.mark.gpu\ndef test_b_slow():\n    time.sleep(300)\n",
    )
    path = gpu_tests.main(["--config", str(CONFIG), "--set", f"paths=[{folder}]", "--set", "timeout_s=20",
                           "--set", "result_name=stopped", "--results-dir", str(tmp_path)])  # fmt: skip
    result = json.loads(path.read_text())

    assert result["pytest_exit_code"] == -1 and not result["ran_to_the_end"]
    finished = {test["id"].rsplit("::", 1)[1]: test["outcome"] for test in result["tests"]}
    assert finished["test_a_quick"] == "passed" and finished.get("test_b_slow") != "passed"


def test_parts_split_the_selected_tests_and_gather_into_one_result(tmp_path: Path) -> None:
    folder = _tests_in(tmp_path, TESTS)
    common = ["--config", str(CONFIG), "--set", f"paths=[{folder}]", "--set", "result_name=parted",
              "--results-dir", str(tmp_path)]  # fmt: skip
    with pytest.raises(ConfigError, match=r"part-1-of-2\.json is missing"):
        gpu_tests.main([*common, "--set", "gather=2"])
    parts = [json.loads(gpu_tests.main([*common, "--set", f"part=[{k}, 2]"]).read_text()) for k in (1, 2)]
    whole = json.loads(gpu_tests.main([*common, "--set", "gather=2"]).read_text())

    ids = [{test["id"] for test in part["tests"]} for part in parts]
    assert ids[0] and ids[1] and not ids[0] & ids[1]  # disjoint, neither empty
    assert {test["id"].rsplit("::", 1)[1] for test in whole["tests"]} == {"test_passes", "test_skips", "test_fails"}
    assert whole["counts"] == {"failed": 1, "passed": 1, "skipped": 1} and whole["ran_to_the_end"]
    assert [part["name"] for part in whole["parts"]] == ["parted-part-1-of-2", "parted-part-2-of-2"]
    with pytest.raises(ConfigError, match="K > N"):
        gpu_tests.main([*common, "--set", "part=[3, 2]"])


def test_the_default_paths_hold_every_gpu_and_kernels_test() -> None:
    settings = gpu_tests.load_settings(CONFIG, {})
    everywhere = gpu_tests.collect(dataclasses.replace(settings, paths=("tests",)))

    assert everywhere and gpu_tests.collect(settings) == everywhere
