"""The reliability replay's hostile requests against a real `recsys serve` (admin token, in-process store): every
answer is the expected one with a message naming the problem, no 500, no traceback in the server's log; and the
committed reliability.json reproduces from its config and shows no failures."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.common import RESULTS_DIR
from benchmarks.reliability import api
from benchmarks.reproduce import problems_of
from recsys.data.prepared import load_prepared


def test_every_hostile_request_gets_its_clear_answer(registry: tuple[str, str, Path], tmp_path: Path) -> None:
    uri, name, data_dir = registry
    data = load_prepared(data_dir)
    (tmp_path / "token").write_text(api.TOKEN)
    with api.served(name, uri, tmp_path, "--admin-token-file", str(tmp_path / "token")) as server:
        cases = api.hostile_requests(server, "api", data.items["item_id"].to_list(), data.users["user_id"][0])
    assert len(cases) >= 60
    assert [c.name for c in cases if not c.clear] == [], [c.record() for c in cases if not c.clear]
    assert not any(c.server_error or c.traceback for c in cases)


def test_the_committed_result_reproduces_and_has_no_failures() -> None:
    path = RESULTS_DIR / "reliability.json"
    result = json.loads(path.read_text())
    assert problems_of(path) == []
    assert result["server_errors"] == result["tracebacks"] == result["data_lost"] == 0
    assert result["api_inputs"] >= 60 and result["bad_files_and_configs"] >= 20
    assert result["cases"] >= 300 and result["runtime_items"] >= 30 and result["enrich"] >= 30
    replayed = {case["name"] for case in result["by_case"]}
    for findings in ("issue_items", "second_review_items", "third_review_items"):
        assert all(cases and set(cases) <= replayed for cases in result[findings].values()), findings
    assert result["schemathesis"]["failures"] == 0 and result["schemathesis"]["no_issues_found"]
