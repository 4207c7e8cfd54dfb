"""The evaluation dashboard end to end, over the real MLflow store of one pipeline run (with its evaluate step):
GET /dashboard through the app (runs, slices, no external script), the pages of a bundle without a store and of
a missing store, and the page drawn by a real headless Chromium (every chart div gets plotly's SVG, the screenshot
shows the chart colours)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from recsys.dashboard.render import PALETTE
from serving.main import create_app
from serving.routers.dashboard import PLOTLY_JS_PATH
from serving.settings import ServingSettings
from tests.browser import chromium_or_skip, read_png, run_chromium
from tests.conftest import recsys_serve
from tests.recsys.dashboard.test_honest_views import honest_views_page
from tests.recsys.dashboard.test_render import chart_ids, semantic_id_page

CHARTS = {
    "chart-comparison",
    "chart-trend",
    *(f"chart-slice-{f}" for f in ("cold_start", "popularity_decile", "history_length", "domain")),
}


@pytest.fixture(scope="module")
def client(registry: tuple[str, str, Path]) -> Iterator[TestClient]:
    uri, name, _ = registry
    with TestClient(create_app(ServingSettings(model_name=name, tracking_uri=uri, reload_interval_s=0))) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def page(client: TestClient) -> str:
    response = client.get("/dashboard")
    assert response.status_code == 200, response.text[:2000]
    assert response.headers["content-type"].startswith("text/html")
    return response.text


def test_dashboard_shows_runs_comparison_and_slices(page: str) -> None:
    for section in ("runs", "comparison", "champion", "trend", "slices", "semantic-ids"):
        assert f'<section id="{section}">' in page
    assert "tiny-sasrec" in page and re.search(r'<td class="c\d+">sasrec</td>', page)  # the training run: name, model
    assert re.search(r"test/ndcg@10</th>", page) and re.search(r'<td class="c\d+ num[^"]*">0\.\d{4}', page)
    # its test NDCG@10 with the interval its evaluate run logged, around the value
    low, value, high = map(float, re.search(
        r'<td class="c\d+ num[^"]*">(0\.\d{4}) <small>\[(0\.\d{4}), (0\.\d{4})\]</small>', page).group(2, 1, 3)
    )  # fmt: skip
    assert low <= value <= high and low < high
    assert "No challenger to compare with a champion yet" in page  # one run: the champion alone
    assert set(chart_ids(page)) == CHARTS  # the comparison and one chart per slice family
    assert "No semantic IDs" in page  # the empty state of a model without them, with what to run
    # plotly.js is not in the page: one script of this server loads it (no CDN, nothing else from outside)
    assert re.findall(r"<script[^>]*\bsrc\s*=\s*\"([^\"]+)\"", page, re.IGNORECASE) == [PLOTLY_JS_PATH]
    assert not re.search(r"<link[^>]*\bhref\s*=\s*[\"']?https?:", page, re.IGNORECASE)
    assert len(page) < 500_000 and page.count("window.PlotlyConfig") == 1


def test_the_page_is_rendered_once_per_store_state_and_plotly_is_cached_for_good(client: TestClient) -> None:
    first = client.get("/dashboard")
    cache = client.app.state.serving.dashboard_cache  # type: ignore[attr-defined]
    rendered = dict(cache.pages)
    again = client.get("/dashboard", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and again.headers["etag"] == first.headers["etag"] and not again.content
    assert client.get("/dashboard").text == first.text and dict(cache.pages) == rendered  # the same page object
    script = client.get(PLOTLY_JS_PATH)
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert "immutable" in script.headers["cache-control"] and len(script.content) > 3_000_000


def test_dashboard_of_one_experiment(client: TestClient) -> None:
    one = client.get("/dashboard", params={"experiment": "tiny-sasrec"}).text
    assert set(chart_ids(one)) == CHARTS
    unknown = client.get("/dashboard", params={"experiment": "no-such-experiment"})
    assert unknown.status_code == 200 and "no experiment named" in unknown.text and "No training runs" in unknown.text
    assert chart_ids(unknown.text) == []


def test_bundle_without_a_store_says_how_to_configure_it(
    registry: tuple[str, str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for named in ("RECSYS_TRACKING_URI", "MLFLOW_TRACKING_URI"):  # MLflow sets the latter in-process
        monkeypatch.delenv(named, raising=False)
    bundle = registry[2].parent.parent / "bundles" / "tiny-sasrec"  # WORK/data/NAME -> WORK/bundles/NAME
    with TestClient(create_app(ServingSettings(bundle=bundle, reload_interval_s=0))) as bundle_client:
        response = bundle_client.get("/dashboard")
    assert response.status_code == 200 and "RECSYS_TRACKING_URI" in response.text and "Fix:" in response.text
    missing = tmp_path / "absent" / "mlflow.db"
    monkeypatch.setenv("RECSYS_TRACKING_URI", f"sqlite:///{missing}")  # named in the environment
    with TestClient(create_app(ServingSettings(bundle=bundle, reload_interval_s=0))) as bundle_client:
        unavailable = bundle_client.get("/dashboard")
    assert unavailable.status_code == 503 and str(missing) in unavailable.text and "Fix:" in unavailable.text
    assert not missing.exists()  # reading did not create an empty store


def test_dashboard_draws_in_headless_chromium(page: str, registry: tuple[str, str, Path], tmp_path: Path) -> None:
    """The API's page (plotly.js from the server: a real `recsys serve`), and the evaluate step's self-contained
    pages (plotly.js inlined: opened as files)."""
    chromium = chromium_or_skip()
    uri, name, _ = registry
    start = time.perf_counter()
    sid_path = tmp_path / "semantic-ids.html"
    sid_path.write_text(semantic_id_page())
    honest_path = tmp_path / "champion-and-trend.html"
    honest_path.write_text(honest_views_page())
    honest_charts = {"chart-comparison", "chart-champion", "chart-trend"}
    with recsys_serve("--model-name", name, "--tracking-uri", uri, "--reload-interval-s", "0") as (base, _):
        served = f"{base}/dashboard"
        pages = ((served, page, CHARTS), (sid_path.as_uri(), sid_path.read_text(), {"chart-semantic-ids"}),
                 (honest_path.as_uri(), honest_path.read_text(), honest_charts))  # fmt: skip
        for url, html, expected in pages:
            dom = run_chromium(chromium, tmp_path / "profile", "--dump-dom", url).stdout
            # every chart div got plotly's drawing: an <svg class="main-svg"> before the next chart's div
            assert set(chart_ids(html)) == expected
            drawn = re.split(r'id="(chart-[^"]+)"', dom)[1:]  # [id, what follows it, id, what follows it, ...]
            svg_after = {c: 'class="main-svg"' in after for c, after in zip(drawn[::2], drawn[1::2], strict=True)}
            assert svg_after == dict.fromkeys(expected, True), svg_after
        shot = tmp_path / "dashboard.png"
        run_chromium(chromium, tmp_path / "profile", f"--screenshot={shot}", served)
    pixels = read_png(shot)[..., :3]  # (800, 1200, 3)
    assert pixels.shape == (800, 1200, 3)
    colours = np.unique(pixels.reshape(-1, 3), axis=0)
    first_trace = np.array([int(PALETTE[0][i : i + 2], 16) for i in (1, 3, 5)])  # the first run's bars
    bar_pixels = int((np.abs(pixels.astype(np.int64) - first_trace).max(axis=-1) <= 3).sum())
    assert len(colours) > 50 and bar_pixels > 2_000, (len(colours), bar_pixels)  # text, table and a drawn chart
    print(f"chromium: DOM + screenshot in {time.perf_counter() - start:.1f} s")  # noqa: T201
