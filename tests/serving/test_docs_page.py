"""The OpenAPI page `/docs` works offline: Swagger UI's files come from the server (the installed fastapi-offline
package), never from a CDN; a real headless Chromium that can resolve no host but this machine's draws every route."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import numpy as np

from tests.browser import chromium_or_skip, read_png, run_chromium
from tests.conftest import recsys_serve

BUNDLE = Path(__file__).parents[1] / "fixtures" / "serve-bundle"
POST_GREEN = np.array([0x49, 0xCC, 0x90])  # Swagger UI's POST badge


def test_docs_load_their_scripts_from_this_server(tmp_path: Path) -> None:
    chromium = chromium_or_skip()
    with recsys_serve("--bundle", str(BUNDLE), "--reload-interval-s", "0") as (base, _):
        page = httpx.get(f"{base}/docs", timeout=10).text
        sources = re.findall(r'(?:src|href)="([^"]+)"', page)
        assert sources and all(source.startswith("/") for source in sources), sources  # nothing from elsewhere
        assert all(httpx.get(base + source, timeout=10).status_code == 200 for source in sources)
        dom = run_chromium(chromium, tmp_path / "profile", "--dump-dom", f"{base}/docs").stdout
        shot = tmp_path / "docs.png"
        run_chromium(chromium, tmp_path / "profile", f"--screenshot={shot}", f"{base}/docs")
    for path in ("/v1/recommendations", "/v1/events", "/v1/similar-items/{item_id}"):
        assert f'data-path="{path}"' in dom, path  # Swagger UI drew the operation
    pixels = read_png(shot)[..., :3].astype(np.int64)  # (800, 1200, 3)
    colours = len(np.unique(pixels.reshape(-1, 3), axis=0))
    post_badges = int((np.abs(pixels - POST_GREEN).max(axis=-1) <= 8).sum())
    assert colours > 50 and post_badges > 500, (colours, post_badges)  # not blank: text and the operations drawn
