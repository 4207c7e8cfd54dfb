"""A result's name from its `result_name` setting: `{device}` filled in, anything else refused before the run, and a
name that is a path never written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.common import REPO, Reproduce, check_result_template, result_name_for, write_result
from benchmarks.kernels import hstu_attention
from benchmarks.kernels.embedding_bag import gpu_name
from benchmarks.reproduce import problems_of

RECORD = Reproduce("benchmarks.kernels.hstu_attention", "benchmarks/configs/kernels-hstu-attention-smoke.yaml", {})


def test_the_device_field_is_filled_in_and_a_name_without_it_is_kept() -> None:
    assert result_name_for("kernels-hstu-attention-{device}-s64", "h200") == "kernels-hstu-attention-h200-s64"
    assert result_name_for("gpu-tests-h100", "h200") == "gpu-tests-h100"


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("kernels-{gpu}", r"only \{device\} may stand in braces"),
        ("kernels-{device", r"only \{device\} may stand in braces"),
        ("kernels-{0}", r"only \{device\} may stand in braces"),
        ("../elsewhere-{device}", "letters, digits"),
        ("a/b", "letters, digits"),
        ("", "letters, digits"),
    ],
)
def test_a_template_that_cannot_name_a_file_of_the_results_folder_is_refused(template: str, why: str) -> None:
    with pytest.raises(SystemExit, match=why):
        check_result_template(template)


def test_a_name_that_is_a_path_is_never_written(tmp_path: Path) -> None:
    (tmp_path / "inside").mkdir()
    with pytest.raises(SystemExit, match="letters, digits"):
        write_result("../outside", {}, tmp_path / "inside", RECORD)
    assert list(tmp_path.rglob("*.json")) == []


@pytest.mark.kernels
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_kernel_run_of_one_case_is_written_under_its_own_name_and_reproduces(tmp_path: Path) -> None:
    case = (
        "{name: alone, num_seqs: 2, seq_len: 16, heads: 1, head_dim: 16, lengths: full, time_buckets: 0, "
        "compare_torch: false}"
    )
    path = hstu_attention.main(["--config", str(REPO / RECORD.config), "--set", f"cases=[{case}]", "--set",
                                "steps=[]", "--set", "result_name=kernels-hstu-{device}-alone",
                                "--results-dir", str(tmp_path)])  # fmt: skip
    result = json.loads(path.read_text())
    device = gpu_name(torch.device("cuda" if torch.cuda.is_available() else "cpu"))[1]  # the smoke run's
    assert path.name == f"kernels-hstu-{device}-alone-smoke.json"
    assert result["name"] == path.stem and result["settings"]["result_name"] == "kernels-hstu-{device}-alone"
    assert problems_of(path) == []


def test_a_bad_result_name_fails_before_the_kernel_run(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"only \{device\} may stand in braces"):
        hstu_attention.main(["--config", str(REPO / RECORD.config), "--set", "result_name=kernels-{gpu}",
                             "--results-dir", str(tmp_path)])  # fmt: skip
    assert list(tmp_path.iterdir()) == []
