"""CI's serve-only check: in a venv holding the library and its `serve` extra alone (`make serve-only`), serve the
committed bundle (tests/fixtures/serve-bundle) with `recsys serve` over real HTTP and ask it what a caller asks.

Standard library only (the venv has no test tools). Exits 1 naming what failed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

BUNDLE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "serve-bundle"
NOT_INSTALLED = ("mlflow", "airflow", "plotly", "sentence_transformers", "transformers", "torchrec", "pytest")


def call(base: str, path: str, body: dict | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def check(condition: bool, what: str) -> None:
    if not condition:
        raise SystemExit(f"serve-only check failed: {what}")
    print(f"ok: {what}")


def main() -> None:
    present = [name for name in NOT_INSTALLED if _importable(name)]
    check(not present, f"the serve-only venv holds none of {', '.join(NOT_INSTALLED)} (found: {present})")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    recsys = str(Path(sys.executable).with_name("recsys"))
    server = subprocess.Popen([recsys, "serve", "--bundle", str(BUNDLE), "--port", str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while call_or_none(base, "/readyz") != 200:
            check(server.poll() is None, f"the server runs (it exited {server.returncode})")
            check(time.monotonic() < deadline, "the server is ready within 60 s")
            time.sleep(0.5)
        catalogue = json.loads((BUNDLE / "model" / "metrics.json").read_text())  # a file of the bundle: it is there
        check(bool(catalogue), "the bundle's metrics are readable")
        status, text = call(base, "/v1/recommendations", {"user_id": "u00001", "k": 5})
        answer = json.loads(text)
        check(status == 200 and len(answer["items"]) == 5 and answer["source"] == "model", f"a known user: {text}")
        status, text = call(base, "/v1/events", {"user_id": "someone-new", "item_ids": ["i00001", "i00002"]})
        check(status == 200, f"events are kept: {text}")
        status, text = call(base, "/v1/recommendations", {"user_id": "someone-new", "k": 3})
        check(status == 200 and json.loads(text)["history_length"] == 2, f"events reach recommendations: {text}")
        status, text = call(base, "/v1/similar-items/i00001?k=3")
        check(status == 200 and len(json.loads(text)["items"]) == 3, f"similar items: {text}")
        status, text = call(base, "/dashboard")
        check(status == 503 and "recsys[dashboard]" in text, "the dashboard names the extra it needs")
    finally:
        server.terminate()
        output = server.communicate(timeout=20)[0]
    check("Traceback" not in output, "the server logged no traceback")


def call_or_none(base: str, path: str) -> int | None:
    try:
        return call(base, path)[0]
    except OSError:  # not listening yet
        return None


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    main()
