"""The tests a GPU changes, in one command, each listed with its result: those marked `gpu` (they need CUDA and skip
with a reason elsewhere) and those marked `kernels` (Triton and fused kernels, run natively on a GPU and in Triton's
interpreter on a CPU).

Usage:
    .venv/bin/python -m benchmarks.gpu_tests                     # benchmarks/configs/gpu-tests.yaml
    # on the air-gapped GPU machine, after ../shared/tools/gpu-kit.sh's parts a and b are installed in /tmp/site:
    #   here:  make gpu-test-kit                                  (pytest and Hypothesis wheels in .whl/t)
    #   there: python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/t/*.whl
    #          PYTHONPATH=/tmp/site:$PWD python3 -m benchmarks.gpu_tests --results-dir $OUT

Settings: benchmarks/configs/gpu-tests.yaml (`--config`, `--set KEY=VALUE`): `markers` (a pytest -m expression),
`paths`, `timeout_s` (the whole run's limit; pytest is stopped past it and the result says so).
Writes benchmarks/results/<result_name>.json ({device}: the GPU's short name, or cpu): every selected test's id,
outcome (passed, failed, error, skipped), seconds and, where it did not pass, pytest's message; the counts per
outcome; pytest's exit code.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import REPO, benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from benchmarks.kernels.embedding_bag import gpu_name

logger = logging.getLogger("benchmarks.gpu_tests")

# pytest's exit codes that still mean every selected test ran (1: some failed; 5: none selected)
RAN_TO_THE_END = {0, 1, 5}


@dataclass(frozen=True)
class Settings:
    markers: str = "gpu or kernels"
    paths: tuple[str, ...] = ("tests",)
    timeout_s: int = 1800
    result_name: str = "gpu-tests-{device}"


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/gpu-tests.yaml")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    gpu, slug = gpu_name(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "junit.xml"
        exit_code = run_pytest(settings, report)
        tests = read_junit(report) if report.is_file() else []
    counts = Counter(test["outcome"] for test in tests)
    out = {
        "settings": asdict(settings),
        "device": gpu,
        "pytest_exit_code": exit_code,
        "ran_to_the_end": exit_code in RAN_TO_THE_END,
        "counts": dict(sorted(counts.items())),
        "seconds": significant(sum(test["seconds"] for test in tests)),
        "tests": tests,
        **provenance("triton", "pytest", "hypothesis"),
    }
    path = write_result(settings.result_name.format(device=slug), out, args.results_dir, reproduce)
    for test in tests:
        if test["outcome"] != "passed":
            print(f"{test['outcome']:8} {test['id']}: {test.get('message', '')[:200]}")
    print(f"{dict(counts)} on {gpu}, pytest exit code {exit_code} -> {path}")
    return path


def run_pytest(settings: Settings, report: Path) -> int:
    """pytest on the selected tests in a child process (its own interpreter: the kernels' environment is read at
    import), its JUnit XML report written to `report`; its exit code, or -1 past `timeout_s` (stopped)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", settings.markers,
               f"--junitxml={report}", "-o", "junit_family=xunit2", *settings.paths]  # fmt: skip
    logger.info("running %s", " ".join(command))
    try:
        return subprocess.run(command, cwd=REPO, env=os.environ.copy(), timeout=settings.timeout_s).returncode
    except subprocess.TimeoutExpired:
        logger.error(
            "the tests ran past %d s and were stopped: the result lists what the report holds", settings.timeout_s
        )
        return -1


def read_junit(report: Path) -> list[dict[str, Any]]:
    """Every test case of a JUnit XML report: id, outcome, seconds and, unless it passed, pytest's message."""
    tests = []
    for case in ET.parse(report).getroot().iter("testcase"):
        test: dict[str, Any] = {
            "id": f"{case.get('classname', '')}::{case.get('name', '')}",
            "outcome": "passed",
            "seconds": significant(float(case.get("time", 0.0))),
        }
        for outcome in ("failure", "error", "skipped"):
            found = case.find(outcome)
            if found is not None:
                test["outcome"] = {"failure": "failed"}.get(outcome, outcome)
                test["message"] = found.get("message", "") or (found.text or "").strip()[:2000]
                break
        tests.append(test)
    return tests


if __name__ == "__main__":
    main()
