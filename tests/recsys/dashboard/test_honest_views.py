"""The dashboard's views for deciding what ships: the runs table that fits (key columns shown, the rest behind a
checkbox), intervals beside test figures and as error bars, RUNNING runs marked (stale ones too), the champion vs
challenger view sorted by effect, the trend with promotions; each with its empty state."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from recsys.dashboard import DashboardData, Evaluation, RunSummary, render_dashboard
from recsys.dashboard.data import TrendPoint
from tests.recsys.dashboard.test_render import chart_ids

NOW = datetime(2026, 11, 23, 12, tzinfo=UTC)


def difference(d: float, low: float, high: float, p: float) -> dict[str, float]:
    return {"difference": d, "low": low, "high": high, "p_value": p}


COMPARISON = {
    "challenger": "sasrec-daily", "champion": "sasrec-daily", "users": 3000,
    "uncertainty": {"method": "percentile bootstrap over users", "resamples": 1000, "confidence": 0.95, "seed": 0},
    "overall": {"ndcg@10": difference(0.004, -0.001, 0.009, 0.11)},
    "slices": {"cold_start": [
        {"slice": "warm", "users": 2800, "metrics": {"ndcg@10": difference(0.002, -0.003, 0.007, 0.4)}},
        {"slice": "cold", "users": 200, "metrics": {"ndcg@10": difference(0.03, 0.01, 0.05, 0.002)}},
        {"slice": "empty", "users": 0, "metrics": {}},
    ]},
}  # fmt: skip


def run(name: str, status: str = "FINISHED", started: datetime = NOW, **extra: object) -> RunSummary:
    metrics = {"valid/ndcg@10": 0.05, "test/ndcg@10": 0.04, "test/recall@10": 0.08, "test/ndcg@50": 0.06}
    return RunSummary(name + "0123456789", name, "exp", "sasrec", status, started, metrics, **extra)  # type: ignore[arg-type]


def page(**fields: object) -> str:
    data = DashboardData("t", "test", runs=[run("a")], evaluations=[], generated=NOW)
    return render_dashboard(DashboardData(**{**data.__dict__, **fields}))  # type: ignore[arg-type]


def test_the_runs_table_shows_key_columns_and_hides_the_rest_behind_checkboxes() -> None:
    runs = [run("a", intervals={"test/ndcg@10": (0.038, 0.042)}, params={"train.lr": "0.001"}),
            run("b", "RUNNING", NOW - timedelta(hours=1)), run("c", "RUNNING", NOW - timedelta(days=3))]  # fmt: skip
    html = page(runs=runs)

    headers = re.findall(r'<th class="(c\d+)( hidden)?">([^<]+)</th>', html)
    shown = [name for _, hidden, name in headers if not hidden]
    assert shown == ["run", "model", "started (UTC)", "status", "valid/ndcg@10", "test/recall@10", "test/ndcg@10"]
    hidden = {name for _, flag, name in headers if flag}
    assert hidden == {"experiment", "params", "test/ndcg@50"}
    checkboxes = re.findall(r'<input type="checkbox" data-column="(c\d+)"( checked)?> ([^<]+)</label>', html)
    assert {name for _, _, name in checkboxes} == {name for _, _, name in headers}  # every column has its checkbox
    assert "classList.toggle('hidden'" in html  # the box shows its column's cells
    assert "0.0400 <small>[0.0380, 0.0420]</small>" in html  # the interval beside the test figure
    assert '<td class="c4 status-running">RUNNING</td>' in html
    assert '<td class="c4 status-stale">RUNNING (stale?)</td>' in html  # started 3 days before the page


def test_champion_vs_challenger_sorted_by_effect_with_its_table() -> None:
    html = page(comparison=COMPARISON)

    assert "chart-champion" in chart_ids(html)
    figure = json.loads(re.search(r'Plotly.newPlot\(\s*"chart-champion",\s*(\[.*?\]),\s*\{', html, re.S).group(1))
    dots = figure[0]
    assert dots["y"] == ["all users (n=3,000)", "cold_start: cold (n=200)", "cold_start: warm (n=2,800)"]
    assert dots["x"] == [0.004, 0.03, 0.002]  # the overall first, then the slices by effect; the empty one left out
    assert dots["marker"]["symbol"] == ["circle-open", "circle", "circle-open"]  # filled: the interval excludes 0
    assert dots["error_x"]["arrayminus"] == pytest.approx([0.005, 0.02, 0.005])  # difference - low
    rows = re.findall(r"<tr><td>([^<]+)</td><td class=\"num\">([\d,]+)</td><td class=\"num\">([^<]+)</td>", html)
    assert rows[:2] == [("all users", "3,000", "+0.0040"), ("cold_start: cold", "200", "+0.0300")]
    assert "on the same 3,000 test users" in html and "95% paired bootstrap interval" in html


def test_trend_marks_promotions_and_draws_the_champion_line() -> None:
    trend = [TrendPoint(f"r{i}", f"run{i}", "exp", NOW + timedelta(days=i), 0.04 + i / 1000, (0.038, 0.045 + i / 1000),
                        promoted) for i, promoted in enumerate([True, False, True, None])]  # fmt: skip
    html = page(trend=trend)

    figure = json.loads(re.search(r'Plotly.newPlot\(\s*"chart-trend",\s*(\[.*?\]),\s*\{', html, re.S).group(1))
    points, champion = figure
    assert points["marker"]["symbol"] == ["star", "circle", "star", "circle"]
    assert points["error_y"]["array"] == pytest.approx([0.005] * 4)  # high - value
    assert champion["y"] == [0.04, 0.04, 0.042, 0.042] and champion["line"]["shape"] == "hv"


def honest_views_page() -> str:
    """A page with a champion comparison and a trend of 5 scheduled runs (the browser test draws it)."""
    trend = [TrendPoint(f"r{i}", f"run{i}", "exp", NOW + timedelta(days=i), 0.04 + i / 1000, (0.037, 0.047 + i / 1000),
                        i in (0, 3)) for i in range(5)]  # fmt: skip
    return page(comparison=COMPARISON, trend=trend)


def test_empty_states_say_what_to_run() -> None:
    html = page()
    assert "No challenger to compare with a champion yet" in html and "recsys pipeline run --config" in html
    assert "No evaluations over time yet" in html


def test_slice_error_bars_from_the_report_intervals_and_their_absence_said() -> None:
    entry = {"name": "cold", "users": 10, "recall@10": 0.5, "ndcg@10": 0.2,
             "intervals": {"recall@10": [0.3, 0.7], "ndcg@10": [0.1, 0.3]}}  # fmt: skip
    report = {"name": "m", "model": "sasrec", "protocol": {"ks": [10]}, "slices": {"cold_start": [entry]},
              "intervals": {"ndcg@10": [0.1, 0.3]}}  # fmt: skip
    with_intervals = page(evaluations=[Evaluation(report, "exp", "run1")])
    old = {key: value for key, value in report.items() if key != "intervals"}
    old["slices"] = {"cold_start": [{k: v for k, v in entry.items() if k != "intervals"}]}
    without = page(evaluations=[Evaluation(old, "exp", "run1")])

    figure = json.loads(
        re.search(r'Plotly.newPlot\(\s*"chart-slice-cold_start",\s*(\[.*?\]),\s*\{', with_intervals, re.S).group(1)
    )
    assert [trace["error_y"]["array"] for trace in figure] == [pytest.approx([0.2]), pytest.approx([0.1])]
    assert "error bars: 95 % bootstrap intervals over users" in with_intervals
    assert "these evaluations recorded no intervals" in without


@pytest.mark.parametrize(
    ("days", "at_least"),
    [([0], timedelta(hours=1)), ([0, 1 / 1440], timedelta(hours=1)), ([0, 1, 2, 3, 4], timedelta(days=4.4))],
)
def test_the_trend_has_a_time_axis_of_readable_dates(days: list[float], at_least: timedelta) -> None:
    """One evaluation (the demo's) or two a minute apart: an hour's axis, not plotly's sub-millisecond range around
    one point; five daily runs: their days, 5 % either side."""
    trend = [
        TrendPoint(f"r{i}", f"run{i}", "exp", NOW + timedelta(days=d), 0.04, None, None) for i, d in enumerate(days)
    ]
    points, layout = drawn(page(trend=trend), "chart-trend")
    axis = layout["xaxis"]
    start, end = (datetime.fromisoformat(t) for t in axis["range"])
    times = [datetime.fromisoformat(t) for t in points[0]["x"]]  # wall times in UTC, as plotly.js reads them
    assert axis["type"] == "date" and "UTC" in axis["title"]["text"]
    assert times == [NOW.replace(tzinfo=None) + timedelta(days=d) for d in days]
    assert start < times[0] and times[-1] < end and end - start >= at_least
    assert end - start < at_least * 1.2


def drawn(html: str, chart: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The data and layout JSON of `Plotly.newPlot("chart", data, layout, config)` in the page."""
    decoder, call = json.JSONDecoder(), re.search(rf'Plotly\.newPlot\(\s*"{chart}",', html)
    assert call is not None, f"no {chart} in the page"
    data, end = decoder.raw_decode(html, html.index("[", call.end()))
    layout, _ = decoder.raw_decode(html, html.index("{", end))
    return data, layout
