"""A pytest plugin: each test's outcome appended to a JSON-lines file the moment pytest reports it, so a run that is
interrupted or killed midway still lists every test that finished (a JUnit report is written only at the end).

Usage: python -m pytest -p benchmarks.pytest_outcomes --outcomes-log=PATH ...; `read_outcomes(PATH)` reads it back.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from benchmarks.common import significant

logger = logging.getLogger("benchmarks.pytest_outcomes")

_log: dict[str, Path] = {}  # "path": the file of this pytest process


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--outcomes-log", default=None, help="append each test phase's outcome to this JSON-lines file")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("outcomes_log")
    if path:
        _log["path"] = Path(path)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "path" not in _log:
        return
    line = {"id": report.nodeid, "when": report.when, "outcome": report.outcome,
            "seconds": report.duration, "message": _message(report)}  # fmt: skip
    with _log["path"].open("a", encoding="utf-8") as log:  # one line a write: a kill loses no finished test
        log.write(json.dumps(line) + "\n")


def _message(report: pytest.TestReport) -> str:
    """A skip's reason, a failure's crash line (as pytest's short summary shows it), or nothing."""
    if report.passed:
        return ""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(report.longrepr, "reprcrash", None)
    return str(getattr(crash, "message", "") or report.longreprtext)[:2000]


def read_outcomes(path: Path) -> list[dict[str, Any]]:
    """Every test of a log, in the order they ran: id, outcome (passed, failed, error: a setup or teardown failed,
    skipped), seconds over its phases and, unless it passed, the message. A last line cut by a kill is left out."""
    phases: dict[str, list[dict[str, Any]]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        logger.error("no outcomes to read (%s): the result lists no test", error)
        return []
    for text in lines:
        try:
            line = json.loads(text)
        except json.JSONDecodeError:
            continue
        phases.setdefault(line["id"], []).append(line)
    return [_test(test_id, reports) for test_id, reports in phases.items()]


def _test(test_id: str, reports: list[dict[str, Any]]) -> dict[str, Any]:
    test: dict[str, Any] = {"id": test_id, "outcome": "passed",
                            "seconds": significant(sum(r["seconds"] for r in reports))}  # fmt: skip
    failed = next((r for r in reports if r["outcome"] == "failed"), None)
    skipped = next((r for r in reports if r["outcome"] == "skipped"), None)
    if failed is not None:
        test["outcome"], test["message"] = "failed" if failed["when"] == "call" else "error", failed["message"]
    elif skipped is not None:
        test["outcome"], test["message"] = "skipped", skipped["message"]
    elif not any(r["when"] == "call" for r in reports):
        test["outcome"], test["message"] = "error", "no result: the run was stopped during it"
    return test
