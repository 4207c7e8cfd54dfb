"""Fuzzing the API from its own OpenAPI spec with schemathesis: no input may cause a server error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import recsys_serve


def test_no_generated_request_causes_a_server_error(registry: tuple[str, str, Path], tmp_path: Path) -> None:
    uri, name, _ = registry
    schemathesis = str(Path(sys.executable).with_name("schemathesis"))
    with recsys_serve("--model-name", name, "--tracking-uri", uri) as (base, _):
        run = subprocess.run(
            [
                schemathesis, "run", f"{base}/openapi.json",
                "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                "response_schema_conformance",
                "--phases", "examples,coverage,fuzzing",
                "--max-examples", "60",
                "--seed", "0",
                "--workers", "1",
                "--report", "junit", "--report-dir", str(tmp_path),
            ],
            capture_output=True, text=True, timeout=600, cwd=tmp_path,  # its cache dir goes there
        )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "No issues found" in run.stdout
