"""benchmarks.gpu_tests runs pytest on the selected tests in a real child process and lists each with its result."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from benchmarks import gpu_tests
from benchmarks.common import REPO
from benchmarks.pytest_outcomes import read_outcomes
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


SLOW = """
import signal
import time

import pytest


@pytest.mark.gpu
def test_a_quick():
    pass


@pytest.mark.gpu
def test_b_slow():
    if DEAF:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a test stuck in native code: SIGINT does not stop it
    time.sleep(300)
"""


# the run's limit: long enough for the child pytest to start and pass test_a_quick on a loaded 2-core CI machine
# (22 s was not, once), short beside test_b_slow's 300 s
STOPPED_AFTER_S = 40


@pytest.mark.parametrize("deaf", [False, True], ids=["interrupted", "killed"])
def test_a_run_past_its_limit_is_stopped_and_lists_the_tests_that_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deaf: bool
) -> None:
    monkeypatch.setattr(gpu_tests, "STOP_GRACE_S", 3)
    folder = _tests_in(tmp_path, f"DEAF = {deaf}\n" + SLOW)
    started = time.monotonic()
    path = gpu_tests.main(["--config", str(CONFIG), "--set", f"paths=[{folder}]",
                           "--set", f"timeout_s={STOPPED_AFTER_S}", "--set", "result_name=stopped",
                           "--results-dir", str(tmp_path)])  # fmt: skip
    result = json.loads(path.read_text())

    assert time.monotonic() - started < STOPPED_AFTER_S + 10  # the grace lies within timeout_s; a deaf one is killed
    assert result["pytest_exit_code"] == -1 and not result["ran_to_the_end"]
    finished = {test["id"].rsplit("::", 1)[1]: test["outcome"] for test in result["tests"]}
    assert finished["test_a_quick"] == "passed" and finished.get("test_b_slow") != "passed"


def test_outcomes_are_read_per_test_over_its_phases_and_a_line_cut_by_a_kill_is_left_out(tmp_path: Path) -> None:
    lines = [
        {"id": "t.py::ok", "when": "setup", "outcome": "passed", "seconds": 0.5, "message": ""},
        {"id": "t.py::ok", "when": "call", "outcome": "passed", "seconds": 1.0, "message": ""},
        {"id": "t.py::ok", "when": "teardown", "outcome": "passed", "seconds": 0.25, "message": ""},
        {"id": "t.py::no_gpu", "when": "setup", "outcome": "skipped", "seconds": 0.0, "message": "needs CUDA"},
        {"id": "t.py::bad_fixture", "when": "setup", "outcome": "failed", "seconds": 0.0, "message": "OSError: x"},
        {"id": "t.py::wrong", "when": "setup", "outcome": "passed", "seconds": 0.0, "message": ""},
        {"id": "t.py::wrong", "when": "call", "outcome": "failed", "seconds": 2.0, "message": "assert 1 == 2"},
        {"id": "t.py::cut", "when": "setup", "outcome": "passed", "seconds": 0.0, "message": ""},
    ]
    log = tmp_path / "outcomes.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"id": "t.py::cut", "wh')

    tests = {test["id"]: test for test in read_outcomes(log)}
    assert tests["t.py::ok"] == {"id": "t.py::ok", "outcome": "passed", "seconds": 1.75}
    assert (tests["t.py::no_gpu"]["outcome"], tests["t.py::no_gpu"]["message"]) == ("skipped", "needs CUDA")
    assert tests["t.py::bad_fixture"]["outcome"] == "error" and tests["t.py::wrong"]["outcome"] == "failed"
    assert tests["t.py::cut"]["outcome"] == "error"  # its call never reported: stopped during it
    assert read_outcomes(tmp_path / "absent.jsonl") == []


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
    walls = [part["wall_seconds"] for part in parts]  # one after the other here: the whole spans both and the gap
    assert min(walls) > 0 and whole["wall_seconds"] >= sum(walls) - 0.01
    older = tmp_path / "parted-part-1-of-2.json"  # a part written before parts said when they started
    older.write_text(json.dumps({key: value for key, value in parts[0].items() if key != "started_unix_s"}))
    assert json.loads(gpu_tests.main([*common, "--set", "gather=2"]).read_text())["wall_seconds"] is None
    with pytest.raises(ConfigError, match="K > N"):
        gpu_tests.main([*common, "--set", "part=[3, 2]"])


def test_recorded_seconds_balance_the_parts_and_a_test_without_a_record_counts_as_their_median(
    tmp_path: Path,
) -> None:
    root = str(REPO.resolve())
    seconds = {"tests/a.py::long": 300.0, "tests/a.py::short": 5.0, "tests/b.py::long": 280.0,
               "tests/b.py::short": 5.0, "tests/c.py::mid": 100.0}  # fmt: skip
    ids = sorted(f"{root}/{test}" for test in [*seconds, "tests/c.py::new"])  # new: no record, the median 100
    parts = [gpu_tests.balanced_part(ids, k, 2, seconds) for k in (1, 2)]
    assert sorted(parts[0] + parts[1]) == ids and not set(parts[0]) & set(parts[1])  # disjoint, covering
    loads = [sum(seconds.get(test.removeprefix(root + "/"), 100.0) for test in part) for part in parts]
    assert loads == [400.0, 390.0]  # every N-th of the sorted ids: 680 against 110
    assert parts == [gpu_tests.balanced_part(ids, k, 2, seconds) for k in (1, 2)]  # every process splits alike
    result = tmp_path / "no-seconds.json"
    result.write_text(json.dumps({"tests": [{"id": "t.py::a"}]}))
    with pytest.raises(ConfigError, match=r"is not a result of this benchmark with its tests' seconds.*Fix: name one"):
        gpu_tests.load_settings(CONFIG, {"balance_from": str(result)})
    settings = gpu_tests.load_settings(CONFIG, {"balance_from": "benchmarks/results/gpu-tests-h200.json"})
    assert len(gpu_tests.recorded_seconds(settings.balance_from)) > 100


def test_the_default_paths_hold_every_gpu_and_kernels_test() -> None:
    settings = gpu_tests.load_settings(CONFIG, {})
    everywhere = gpu_tests.collect(dataclasses.replace(settings, paths=("tests",)))

    assert everywhere and gpu_tests.collect(settings) == everywhere


def test_side_by_side_runs_the_parts_at_once_and_gathers_them(tmp_path: Path) -> None:
    folder = _tests_in(tmp_path, TESTS)
    common = ["--config", str(CONFIG), "--set", f"paths=[{folder}]", "--set", "result_name=together",
              "--results-dir", str(tmp_path)]  # fmt: skip
    whole = json.loads(gpu_tests.main([*common, "--side-by-side", "2"]).read_text())

    parts = [json.loads((tmp_path / f"together-part-{k}-of-2.json").read_text()) for k in (1, 2)]
    assert [part["name"] for part in whole["parts"]] == ["together-part-1-of-2", "together-part-2-of-2"]
    assert {test["id"].rsplit("::", 1)[1] for test in whole["tests"]} == {"test_passes", "test_skips", "test_fails"}
    assert whole["counts"] == {"failed": 1, "passed": 1, "skipped": 1} and whole["ran_to_the_end"]
    starts = [part["started_unix_s"] for part in parts]
    ends = [part["started_unix_s"] + part["wall_seconds"] for part in parts]
    assert max(starts) < min(ends)  # the two ran at once
    with pytest.raises(ConfigError, match="drop part and gather"):
        gpu_tests.main([*common, "--side-by-side", "2", "--set", "part=[1, 2]"])
