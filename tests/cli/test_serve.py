"""`recsys serve` as a real server process on loopback, answering real HTTP requests."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import recsys_serve


def test_recsys_serve_answers_http(registry: tuple[str, str, Path]) -> None:
    uri, name, _ = registry
    with recsys_serve(uri, name) as (base, server):
        response = httpx.post(f"{base}/v1/recommendations", json={"user_id": "u00003", "k": 3}, timeout=10)
        assert response.status_code == 200 and len(response.json()["items"]) == 3
        assert httpx.get(f"{base}/openapi.json", timeout=5).json()["paths"].keys() >= {
            "/v1/recommendations",
            "/v1/events",
        }
    assert server.stdout is not None
    assert "serving tiny-sasrec@" in server.stdout.read()
