"""Fuzzing the API from its own OpenAPI spec with schemathesis: no input may cause a server error. The server runs
as deployed for a security review: an admin token (the admin routes are exercised with it), API keys on the public
routes, an adapter root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import recsys_serve
from tests.serving.conftest import ADMIN_TOKEN


def test_no_generated_request_causes_a_server_error(registry: tuple[str, str, Path], tmp_path: Path) -> None:
    uri, name, _ = registry
    schemathesis = str(Path(sys.executable).with_name("schemathesis"))
    (tmp_path / "token").write_text(ADMIN_TOKEN + "\n")
    (tmp_path / "keys").write_text("key-one\nkey-two\n")
    (tmp_path / "adapters").mkdir()
    secured = ["--admin-token-file", str(tmp_path / "token"), "--api-keys-file", str(tmp_path / "keys")]
    # every reload is let through (the limit has its own test): the fuzzer exercises the reload itself
    secured += ["--adapter-root", str(tmp_path / "adapters"), "--reload-min-interval-s", "0"]
    with recsys_serve("--model-name", name, "--tracking-uri", uri, *secured) as (base, _):
        assert httpx.get(f"{base}/openapi.json", timeout=5).status_code == 401  # the spec needs a key too
        spec = httpx.get(f"{base}/openapi.json", headers={"X-API-Key": "key-one"}, timeout=5)
        assert {"/v1/admin/reload", "/v1/admin/adapters/{domain}"} <= spec.json()["paths"].keys()
        (tmp_path / "openapi.json").write_bytes(spec.content)
        run = subprocess.run(
            [
                schemathesis, "run", str(tmp_path / "openapi.json"), "--url", base,
                "--header", f"Authorization: Bearer {ADMIN_TOKEN}", "--header", "X-API-Key: key-two",
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
    assert "No issues found" in run.stdout, run.stdout[-6000:]
