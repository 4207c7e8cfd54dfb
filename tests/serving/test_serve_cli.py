"""`recsys serve` as a real server process on loopback, answering real HTTP requests."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_recsys_serve_answers_http(registry: tuple[str, str, Path]) -> None:
    uri, name, _ = registry
    port = _free_port()
    recsys = str(Path(sys.executable).with_name("recsys"))  # the console script of this environment
    command = [recsys, "serve", "--model-name", name, "--tracking-uri", uri, "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        else:
            raise AssertionError("the server did not become ready in 60 s")
        response = httpx.post(f"{base}/v1/recommendations", json={"user_id": "u00003", "k": 3}, timeout=10)
        assert response.status_code == 200 and len(response.json()["items"]) == 3
        assert httpx.get(f"{base}/openapi.json", timeout=5).json()["paths"].keys() >= {
            "/v1/recommendations",
            "/v1/events",
        }
    finally:
        server.terminate()
        output = server.communicate(timeout=20)[0]
    assert "serving tiny-sasrec@" in output
