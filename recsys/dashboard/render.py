"""Render `DashboardData` as one HTML page: plotly.js inlined once (self-contained: the evaluate step's
dashboard.html, no CDN, no network), or loaded from a URL the server serves it at (the API's `/dashboard`, where
every page would otherwise carry its 4.8 MB again).

Sections (each with an empty state that says what to run to fill it):

    runs            the training runs table (newest first; the best value of each metric column in bold; a few key
                    columns shown, the rest one click away; test figures with their 95 % interval where logged)
    comparison      validation and test Recall@k / NDCG@k across runs, grouped bars (test: with error bars)
    champion        the newest evaluation against the champion's, user by user: each slice's difference with its
                    95 % paired interval, sorted by effect, slices whose interval excludes 0 marked
    trend           every evaluation's test NDCG@10 over time with its interval, promoted runs marked, the
                    champion's value as a step line
    slices          one chart per slice family (cold start, popularity deciles, history length, domain):
                    Recall@K and NDCG@K per slice of each evaluation (error bars: 95 % intervals), bars labelled with
                    the slice's users
    search          Recall@K and NDCG@K per query difficulty level of each query-aware evaluation, with history+query
                    and with the query alone, its history-only figure a dashed line, bars labelled with the users
                    the level queries
    semantic-ids    codebook utilisation and perplexity per level, collision rate (models with semantic IDs)

Every text that comes from a run (names, params, domains) is HTML-escaped, in the page and in the charts
(plotly draws labels as a small HTML subset, so escaped text shows literally).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from recsys.dashboard.data import TREND_METRIC, DashboardData, Evaluation, RunSummary, TrendPoint
from recsys.data.schema import ITEM_ID
from recsys.enrich.record import FIELDS
from recsys.runtime.extras import optional

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
SLICE_FAMILIES = {  # family -> (heading, what a slice is)
    "cold_start": ("Cold-start items", "target item never seen in training (cold) or seen (warm)"),
    "popularity_decile": ("Item popularity deciles", "decile of the target item's training count, 10 = most popular"),
    "history_length": ("History length", "number of history items the model reads"),
    "domain": ("Domain", "domain of the target item"),
}
SEARCH_SETTINGS = {"history+query": "", "no-history": "/"}  # setting -> bar pattern (the query alone: hatched)
SEARCH_HINT = "recsys pipeline run --config configs/beauty/query-aware.yaml"
NO_DOMAINS = (
    '<div class="empty">The evaluated data has no item domains (no domain column in items.parquet); data with '
    "domains, e.g. the synthetic source, fills this chart.</div>"
)
COMPARED_METRICS = ("recall", "ndcg")
MAX_COMPARED_RUNS = 12  # the newest runs in the comparison chart (the table lists them all)
# the trend's narrowest time axis: one evaluation, or a few minutes apart, reads in minutes (plotly's own range around
# one point ticks in fractions of a millisecond)
TREND_MIN_SPAN = timedelta(hours=1)
RUN_COLUMNS = ("run", "experiment", "model", "started (UTC)", "status", "params")
# shown before any click: what tells runs apart; the other columns are one checkbox away
DEFAULT_COLUMNS = ("run", "model", "started (UTC)", "status", "test/ndcg@10", "test/recall@10", "valid/ndcg@10")
INTERVAL_TEXT = "error bars: 95 % bootstrap intervals over users"
COMPARISON_HINT = "recsys pipeline run --config CONFIG (a second run of a registered model: its evaluation is paired "
COMPARISON_HINT += "with the champion's)"

_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 0 16px 48px; color: #1d2330; background: #fff; }
header { border-bottom: 1px solid #d8dce3; margin-bottom: 12px; }
h1 { font-size: 22px; margin: 16px 0 4px; } h2 { font-size: 18px; margin: 24px 0 8px; }
h3 { font-size: 15px; margin: 16px 0 4px; } .meta, .explain { color: #5b6475; margin: 4px 0 10px; }
nav a { margin-right: 14px; } .table-wrap { max-height: 340px; overflow: auto; border: 1px solid #d8dce3; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { padding: 4px 8px; border-bottom: 1px solid #eceef2; text-align: left; white-space: nowrap; }
td.params { white-space: normal; min-width: 180px; max-width: 260px; }
th { position: sticky; top: 0; background: #f4f6f9; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.best { font-weight: 700; } code { background: #f4f6f9; padding: 1px 4px; border-radius: 3px; }
td.num small { color: #5b6475; font-weight: 400; } .hidden { display: none; } details.columns { margin: 4px 0 8px; }
details.columns label { margin-right: 12px; white-space: nowrap; } .status-running { color: #8a4b00; }
.status-stale { color: #b00020; font-weight: 700; }
.empty { border: 1px dashed #b8bfcc; background: #fafbfc; padding: 12px 14px; border-radius: 4px; }
.notes li { color: #8a4b00; }
"""


def render_dashboard(data: DashboardData, plotly_js_url: str | None = None) -> str:
    """The whole page for `data`: one HTML document with plotly.js before the first chart, inlined, or (with
    `plotly_js_url`) a script element loading it from there."""
    optional("plotly", extra="dashboard", feature="the evaluation dashboard")
    figures: list[str] = []  # rendered chart divs, in page order; the first carries plotly.js
    plotly_js: bool | str = plotly_js_url or True

    def chart(figure: Any, key: str) -> str:
        figures.append(key)
        return _figure_html(figure, key, include_plotlyjs=plotly_js if len(figures) == 1 else False)

    evaluations = data.evaluations
    sections = [
        _section("runs", "Runs", _runs_table(data.runs, data) if data.runs else _empty_runs(data)),
        _section(
            "comparison",
            "Metrics across runs",
            chart(_comparison_figure(data.runs), "comparison") if data.runs else _empty_runs(data),
            "Validation and test metrics of the newest runs (leave-one-out, all items ranked)"
            + (f"; {INTERVAL_TEXT} where the run's evaluation logged them." if _any_interval(data.runs) else "."),
        ),
        _section("champion", "Champion vs challenger", _champion(data, chart), _champion_explain(data)),
        _section(
            "trend",
            "Trend",
            chart(_trend_figure(data.trend), "trend")
            if data.trend
            else _empty("No evaluations over time yet: each scheduled run's evaluate step adds a point.", data.hint),
            _trend_explain(data.trend),
        ),
        _section("slices", "Slices", _slices(evaluations, data.hint, chart), _slices_explain(evaluations)),
        _section("search", "Search", _search(evaluations, chart), _search_explain(evaluations)),
        _section("semantic-ids", "Semantic-ID health", _semantic_ids(evaluations, chart)),
        _section("metadata", "Item metadata", _metadata(evaluations), _metadata_explain(evaluations)),
        _section(
            "expert-load",
            "Expert load",
            _expert_load(evaluations, chart),
            "Mixture-of-experts heads: share of routed training examples per expert (1 / E each when balanced).",
        ),
    ]
    if data.notes:
        notes = "".join(f"<li>{html.escape(note)}</li>" for note in data.notes)
        sections.append(_section("notes", "Notes", f'<ul class="notes">{notes}</ul>'))
    meta = (
        f"Source: <code>{html.escape(data.source)}</code> · {len(data.runs)} training run(s) · "
        f"{len(evaluations)} evaluation(s) · generated {data.generated:%Y-%m-%d %H:%M:%S} UTC"
    )
    nav = " ".join(
        f'<a href="#{anchor}">{title}</a>'
        for anchor, title in (("runs", "Runs"), ("comparison", "Comparison"), ("champion", "Champion vs challenger"),
                              ("trend", "Trend"), ("slices", "Slices"), ("search", "Search"),
                              ("semantic-ids", "Semantic IDs"), ("metadata", "Metadata"),
                              ("expert-load", "Expert load"))
    )  # fmt: skip
    body = f'<header><h1>{html.escape(data.title)}</h1><p class="meta">{meta}</p><nav>{nav}</nav></header>'
    return _page(data.title, body + "".join(sections))


def render_message(title: str, message: str, fix: str) -> str:
    """A small page (no charts) that says what is wrong and how to fix it, e.g. no MLflow store configured."""
    body = (
        f"<header><h1>{html.escape(title)}</h1></header>"
        f'<div class="empty"><p>{html.escape(message)}</p><p><b>Fix:</b> {html.escape(fix)}</p></div>'
    )
    return _page(title, body)


# ------------------------------------------------------------------------------------------------- page parts


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n<body>{body}</body></html>\n"
    )


def _section(anchor: str, title: str, content: str, explain: str = "") -> str:
    intro = f'<p class="explain">{html.escape(explain)}</p>' if explain else ""
    return f'<section id="{anchor}"><h2>{html.escape(title)}</h2>{intro}{content}</section>\n'


def _empty(message: str, command: str) -> str:
    return f'<div class="empty">{html.escape(message)} Run <code>{html.escape(command)}</code>.</div>'


def _empty_runs(data: DashboardData) -> str:
    return _empty(f"No training runs in {data.source} yet.", f"{data.hint} (or make demo) with this tracking URI")


def _metric_columns(runs: Sequence[RunSummary]) -> list[str]:
    """'valid/recall@5', ... in a stable order: split, metric, k."""
    names = {name for run in runs for name in run.metrics}

    def order(name: str) -> tuple[int, int, int]:
        split, metric_k = name.split("/")
        metric, k = metric_k.split("@")
        return (split != "valid", COMPARED_METRICS.index(metric) if metric in COMPARED_METRICS else 9, int(k))

    return sorted(names, key=order)


def _runs_table(runs: Sequence[RunSummary], data: DashboardData) -> str:
    """Every run, every column; those outside `DEFAULT_COLUMNS` hidden until their checkbox is ticked (a few lines
    of inline script: the page stays self-contained)."""
    metric_columns = _metric_columns(runs)
    columns = [*RUN_COLUMNS, *metric_columns]
    best = {c: max((r.metrics[c] for r in runs if c in r.metrics), default=None) for c in metric_columns}
    shown = [c for c in columns if c in DEFAULT_COLUMNS] or columns

    def cell(column: str, content: str, css: str = "") -> str:
        hidden = "" if column in shown else " hidden"
        return f'<td class="c{columns.index(column)}{css}{hidden}">{content}</td>'

    head = "".join(
        f'<th class="c{i}{"" if c in shown else " hidden"}">{html.escape(c)}</th>' for i, c in enumerate(columns)
    )
    rows = []
    for run in runs:
        started = f"{run.start_time:%Y-%m-%d %H:%M}" if run.start_time else ""
        params = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in run.params.items())
        status = run.shown_status(data.generated)
        stale, running = status.endswith("(stale?)"), status.startswith("RUNNING")
        status_css = " status-stale" if stale else " status-running" if running else ""
        run_id = html.escape(run.run_id)
        cells = [
            cell("run", f'<span title="{run_id}">{html.escape(run.name)} <small>{run_id[:8]}</small></span>'),
            *(cell(c, html.escape(text)) for c, text in zip(("experiment", "model", "started (UTC)"),
                                                            (run.experiment, run.model, started), strict=True)),
            cell("status", html.escape(status), status_css),
            cell("params", html.escape(params), " params"),
        ]  # fmt: skip
        for column in metric_columns:
            value = run.metrics.get(column)
            is_best = value is not None and value == best[column] and len(runs) > 1
            text = "" if value is None else f"{value:.4f}"
            if value is not None and column in run.intervals:
                low, high = run.intervals[column]
                text += f" <small>[{low:.4f}, {high:.4f}]</small>"
            cells.append(cell(column, text, " num best" if is_best else " num"))
        rows.append(f"<tr>{''.join(cells)}</tr>")
    chooser = "".join(
        f'<label><input type="checkbox" data-column="c{i}"{" checked" if c in shown else ""}> {html.escape(c)}</label>'
        for i, c in enumerate(columns)
    )
    script = (
        "<script>document.querySelectorAll('details.columns input').forEach(box => box.addEventListener('change', "
        "() => document.querySelectorAll('.' + box.dataset.column).forEach(el => el.classList.toggle('hidden', "
        "!box.checked))));</script>"
    )
    return (
        f'<details class="columns"><summary>Columns ({len(shown)} of {len(columns)} shown)</summary>{chooser}</details>'
        f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></div>'
        + script
    )


def _any_interval(runs: Sequence[RunSummary]) -> bool:
    return any(run.intervals for run in runs)


def _champion_explain(data: DashboardData) -> str:
    comparison = data.comparison
    if comparison is None:
        return ""
    uncertainty = comparison.get("uncertainty", {})
    return (
        f"{comparison['challenger']} (the newest evaluation) minus the champion {comparison['champion']}, on the same "
        f"{comparison['users']:,} test users: each slice's difference of {TREND_METRIC} with its "
        f"{uncertainty.get('confidence', 0.95):.0%} paired bootstrap interval ({uncertainty.get('resamples', '?')} "
        "resamples), sorted by effect; a filled marker: the interval excludes 0 (randomisation p-value in the table)."
    )


def _champion(data: DashboardData, chart: Any) -> str:
    comparison = data.comparison
    if comparison is None:
        return _empty("No challenger to compare with a champion yet: it takes a promoted evaluation and a newer one.",
                      COMPARISON_HINT)  # fmt: skip
    rows = _comparison_rows(comparison)
    table = "".join(
        f'<tr><td>{html.escape(label)}</td><td class="num">{users:,}</td><td class="num">{d["difference"]:+.4f}</td>'
        f'<td class="num">[{d["low"]:+.4f}, {d["high"]:+.4f}]</td><td class="num">{d["p_value"]:.3g}</td></tr>'
        for label, users, d in rows
    )
    head = "".join(f"<th>{h}</th>" for h in ("slice", "users", "difference", "95 % interval", "p-value"))
    return chart(_champion_figure(rows), "champion") + (
        f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{table}</tbody></table></div>'
    )


def _comparison_rows(comparison: dict[str, Any]) -> list[tuple[str, int, dict[str, float]]]:
    """(label, users, the headline metric's difference) for the whole test set and every non-empty slice, the
    overall first, then the slices by effect (largest first)."""
    overall = ("all users", int(comparison["users"]), comparison["overall"][TREND_METRIC])
    slices = [
        (f"{family}: {entry['slice']}", int(entry["users"]), entry["metrics"][TREND_METRIC])
        for family, entries in comparison["slices"].items()
        for entry in entries
        if TREND_METRIC in entry.get("metrics", {})
    ]
    return [overall, *sorted(slices, key=lambda row: row[2]["difference"], reverse=True)]


def _trend_explain(trend: Sequence[TrendPoint]) -> str:
    if not trend:
        return ""
    return (
        f"Test {TREND_METRIC} of every evaluate run over time (each scheduled run adds one), with its 95 % bootstrap "
        "interval where logged; a star: the champion gate promoted that run's model; the line: the champion's value."
    )


def _slices_explain(evaluations: Sequence[Evaluation]) -> str:
    if not evaluations:
        return ""
    k = _headline_k(evaluations[0].report.get("protocol", {}))
    return (
        f"Test split, per slice of users: Recall@{k} and NDCG@{k} of the latest evaluate run of each experiment; "
        "each bar is labelled with its slice's number of users"
        + ("; " + INTERVAL_TEXT + "." if any("intervals" in e.report for e in evaluations) else
           " (these evaluations recorded no intervals: evaluate again to get them).")
    )  # fmt: skip


def _slices(evaluations: Sequence[Evaluation], hint: str, chart: Any) -> str:
    if not evaluations:
        return _empty(
            "No evaluation yet: slices come from the pipeline's evaluate step (evaluation.json).",
            f"{hint} (it evaluates the trained model after build_index)",
        )
    parts = []
    for family, (heading, explain) in SLICE_FAMILIES.items():
        present = [e for e in evaluations if e.report.get("slices", {}).get(family)]
        parts.append(f'<h3>{html.escape(heading)}</h3><p class="explain">{html.escape(explain)}</p>')
        if present:
            parts.append(chart(_slice_figure(family, present), f"slice-{family}"))
        elif family == "domain":
            parts.append(NO_DOMAINS)
        else:
            parts.append(_empty(f"The evaluations have no {family} slices.", hint))
    return "".join(parts)


def _search_explain(evaluations: Sequence[Evaluation]) -> str:
    present = [e for e in evaluations if e.report.get("search")]
    if not present:
        return ""
    k = _headline_k(present[0].report["search"])
    return (
        f"Test split, per query difficulty level (title-3: 3 words of the target's title; title-1-2: 1 or 2; "
        f"neighbour-mix: 1 of its words and 1 of the most similar item's): Recall@{k} and NDCG@{k} of the latest "
        "evaluate run of each query-aware experiment, with the user's history and the query (solid) and with the "
        "query alone (hatched); bars labelled with the users the level has a query for. The dashed line is the same "
        "model's history-only recommendation over every test user."
    )


def _search(evaluations: Sequence[Evaluation], chart: Any) -> str:
    present = [e for e in evaluations if e.report.get("search")]
    if not present:
        return _empty(
            "No search evaluation yet: the evaluate step of a model that reads queries measures it (docs/search.md).",
            SEARCH_HINT,
        )
    return chart(_search_figure(present), "search")


def _semantic_ids(evaluations: Sequence[Evaluation], chart: Any) -> str:
    present = [e for e in evaluations if e.report.get("semantic_ids")]
    if not present:
        return _empty(
            "No semantic IDs in the evaluated models: they were trained without them.",
            "recsys pipeline run --config configs/beauty/sasrec-sid.yaml (a config with a sid section)",
        )
    lines = []
    for e in present:
        s = e.report["semantic_ids"]
        recon = s.get("recon_relative")
        lines.append(
            f"<li>{html.escape(e.label)}: {s['num_items']} items, {s['levels']} levels of {s['codebook_size']} codes; "
            f"collision rate {s['collision_rate']:.4f} (largest group {s['max_collision']})"
            + (f"; unexplained variance {recon:.4f}" if recon is not None else "")
            + "</li>"
        )
    return f"<ul>{''.join(lines)}</ul>" + chart(_sid_figure(present), "semantic-ids")


def _metadata_explain(evaluations: Sequence[Evaluation]) -> str:
    if not any(e.report.get("item_metadata") for e in evaluations):
        return ""
    return ("Records an LLM wrote for the items (the enrich step, docs/enrich.md): coverage is the share of the "
            "catalogue with a valid record; a failed answer is counted and never read. Read the examples before "
            "trusting a small model's output.")  # fmt: skip


def _metadata(evaluations: Sequence[Evaluation]) -> str:
    present = [e for e in evaluations if e.report.get("item_metadata")]
    if not present:
        return _empty(
            "No LLM-written item metadata in the evaluated models: their configs have no enrich section.",
            "recsys pipeline run --config CONFIG with an enrich section in CONFIG (docs/enrich.md)",
        )
    lines = []
    for e in present:
        m = e.report["item_metadata"]
        failures = "; ".join(f"{f['reason']} ({f['items']})" for f in m["failures"]) or "none"
        lines.append(
            f"<li>{html.escape(e.label)}: {m['ok']:,} of {m['catalogue_items']:,} items with a valid record "
            f"(coverage {m['coverage']:.1%}, valid {m['valid_fraction']:.1%} of {m['items']:,} answered, "
            f"{m['truncated']:,} with a value cut); model {html.escape(', '.join(m['models']))}, prompt "
            f"{html.escape(', '.join(m['prompt_versions']))}; failures: {html.escape(failures)}</li>"
        )
    columns = (ITEM_ID, *FIELDS)
    head = "".join(f"<th>{c}</th>" for c in columns)

    def cell(value: Any) -> str:
        return html.escape(", ".join(value) if isinstance(value, list) else str(value))

    rows = "".join(
        "<tr>" + "".join(f"<td>{cell(record.get(c))}</td>" for c in columns) + "</tr>"
        for record in present[0].report["item_metadata"]["examples"]
    )
    caption = f"Examples ({html.escape(present[0].label)})"
    return f"<ul>{''.join(lines)}</ul><table><caption>{caption}</caption><tr>{head}</tr>{rows}</table>"


def _expert_load(evaluations: Sequence[Evaluation], chart: Any) -> str:
    present = [e for e in evaluations if e.report.get("expert_load")]
    if not present:
        return _empty(
            "No mixture-of-experts head in the evaluated models.",
            "recsys pipeline run --config CONFIG (a ranker with model.params.head: moe)",
        )
    lines = [
        f"<li>{html.escape(e.label)}: busiest expert {e.report['expert_load'][-1]['max_over_mean']:.2f}x the even "
        f"share in the last epoch ({len(e.report['expert_load'][-1]['fraction'])} experts)</li>"
        for e in present
    ]
    return f"<ul>{''.join(lines)}</ul>" + chart(_expert_load_figure(present), "expert-load")


# ---------------------------------------------------------------------------------------------------- charts


def _figure_html(figure: Any, key: str, include_plotlyjs: bool | str) -> str:
    config = {"displaylogo": False, "responsive": True}
    div = figure.to_html(
        full_html=False, include_plotlyjs=include_plotlyjs, div_id=f"chart-{key}", config=config,
        default_width="100%", default_height=f"{figure.layout.height}px",
    )  # fmt: skip
    return f'<div class="chart" data-chart="{html.escape(key)}">{div}</div>'


def _layout(figure: Any, height: int, title: str = "") -> Any:
    figure.update_layout(
        template="plotly_white", height=height, barmode="group", margin={"l": 50, "r": 20, "t": 50, "b": 50},
        title={"text": html.escape(title), "font": {"size": 14}}, legend={"orientation": "h", "y": -0.18},
    )  # fmt: skip
    return figure


def _comparison_figure(runs: Sequence[RunSummary]) -> Any:
    from plotly.subplots import make_subplots

    runs = list(runs[:MAX_COMPARED_RUNS])
    figure = make_subplots(rows=1, cols=2, subplot_titles=("validation", "test"), shared_yaxes=True)
    columns = _metric_columns(runs)
    for i, run in enumerate(reversed(runs)):  # oldest first: colours stay put as runs are added
        for col, split in enumerate(("valid", "test"), start=1):
            names = [c for c in columns if c.startswith(f"{split}/")]
            values = [run.metrics.get(n) for n in names]
            figure.add_bar(
                x=[n.split("/")[1] for n in names], y=values, row=1, col=col,
                name=html.escape(run.label), legendgroup=run.run_id, showlegend=col == 1,
                marker_color=PALETTE[i % len(PALETTE)],
                error_y=_error_bars(values, [run.intervals.get(n) for n in names]),
            )  # fmt: skip
    return _layout(figure, 420)


def _error_bars(values: Sequence[float | None], intervals: Sequence[Sequence[float] | None]) -> dict[str, Any] | None:
    """Plotly's asymmetric error bars for `values` from their (low, high) intervals; None when none has one (a
    value without an interval gets no bar)."""
    if not any(intervals):
        return None
    above = [None if v is None or i is None else i[1] - v for v, i in zip(values, intervals, strict=True)]
    below = [None if v is None or i is None else v - i[0] for v, i in zip(values, intervals, strict=True)]
    return {"type": "data", "symmetric": False, "array": above, "arrayminus": below, "thickness": 1.2, "width": 3}


def _champion_figure(rows: Sequence[tuple[str, int, dict[str, float]]]) -> Any:
    """A dot per row (overall on top, then by effect) at its difference, its interval as a horizontal error bar; a
    filled dot when the interval excludes 0."""
    import plotly.graph_objects as go

    labels = [f"{html.escape(label)} (n={users:,})" for label, users, _ in rows]
    differences = [d["difference"] for _, _, d in rows]
    excludes_zero = [d["low"] > 0 or d["high"] < 0 for _, _, d in rows]
    figure = go.Figure()
    figure.add_scatter(
        x=differences, y=labels, mode="markers", name=f"difference of {TREND_METRIC}",
        marker={"size": 9, "color": PALETTE[0], "symbol": ["circle" if e else "circle-open" for e in excludes_zero]},
        error_x={"type": "data", "symmetric": False, "array": [d["high"] - d["difference"] for _, _, d in rows],
                 "arrayminus": [d["difference"] - d["low"] for _, _, d in rows], "thickness": 1.2, "width": 3},
        hovertemplate="%{y}: %{x:+.4f}",
    )  # fmt: skip
    figure.add_vline(x=0, line={"color": "#5b6475", "dash": "dash"})
    figure.update_yaxes(autorange="reversed", type="category")
    return _layout(figure, max(260, 24 * len(rows) + 120), f"challenger minus champion, test {TREND_METRIC}")


def _trend_figure(trend: Sequence[TrendPoint]) -> Any:
    import plotly.graph_objects as go

    times = [_utc(p.start_time) for p in trend]
    figure = go.Figure()
    figure.add_scatter(
        x=times, y=[p.value for p in trend], mode="markers+lines", name="each evaluation",
        text=[html.escape(f"{p.name} ({p.experiment}, {p.run_id[:6]})") for p in trend],
        hovertemplate="%{text}: %{y:.4f}", line={"color": "#b8bfcc", "width": 1},
        marker={"size": [13 if p.promoted else 8 for p in trend], "color": PALETTE[0],
                "symbol": ["star" if p.promoted else "circle" for p in trend]},
        error_y=_error_bars([p.value for p in trend], [p.interval for p in trend]),
    )  # fmt: skip
    champion, line = None, []
    for point in trend:
        champion = point.value if point.promoted else champion
        line.append(champion)
    if any(value is not None for value in line):
        figure.add_scatter(x=times, y=line, mode="lines", name="champion",
                           line={"shape": "hv", "color": PALETTE[2], "width": 2})  # fmt: skip
    figure.update_xaxes(type="date", range=_time_range(times), title_text="evaluation started (UTC)")
    return _layout(figure, 360, f"test {TREND_METRIC} over time")


def _utc(time: datetime) -> datetime:
    """`time` in UTC without its zone: plotly.js reads the wall time of a date and drops any offset."""
    return time.astimezone(UTC).replace(tzinfo=None) if time.tzinfo else time


def _time_range(times: Sequence[datetime]) -> list[datetime]:
    """The time axis around `times`: 5 % of their span either side, at least `TREND_MIN_SPAN` in all."""
    first, last = min(times), max(times)
    pad = max((last - first) * 0.05, (TREND_MIN_SPAN - (last - first)) / 2)
    return [first - min(pad, first - datetime.min), last + pad]  # a run without a start time is at datetime.min


def _headline_k(part: dict[str, Any]) -> int:
    """The k charts show: 10 when measured, else the smallest of `part`'s ks (a report's protocol, its search)."""
    ks = [int(k) for k in part.get("ks", [10])] or [10]
    return 10 if 10 in ks else min(ks)


def _slice_figure(family: str, evaluations: Sequence[Evaluation]) -> Any:
    from plotly.subplots import make_subplots

    k = _headline_k(evaluations[0].report.get("protocol", {}))
    figure = make_subplots(rows=1, cols=2, subplot_titles=(f"Recall@{k}", f"NDCG@{k}"))
    for i, evaluation in enumerate(evaluations):
        entries = evaluation.report["slices"][family]
        names = [html.escape(str(entry["name"])) for entry in entries]
        users = [f"n={entry['users']}" for entry in entries]
        for col, metric in enumerate((f"recall@{k}", f"ndcg@{k}"), start=1):
            values = [entry.get(metric, 0.0) for entry in entries]
            intervals = [entry.get("intervals", {}).get(metric) for entry in entries]
            figure.add_bar(  # an empty slice is a 0-high bar labelled n=0
                x=names, y=values, text=users, textposition="outside",
                hovertemplate="%{x}: %{y:.4f} (%{text})", error_y=_error_bars(values, intervals),
                name=html.escape(evaluation.label), legendgroup=str(i), showlegend=col == 1, row=1, col=col,
                marker_color=PALETTE[i % len(PALETTE)], cliponaxis=False,
            )  # fmt: skip
    figure.update_xaxes(type="category")
    return _layout(figure, 380)


def _search_figure(evaluations: Sequence[Evaluation]) -> Any:
    """x = query level; a bar per (evaluation, system, setting), a dashed line per (evaluation, system) history-only."""
    from plotly.subplots import make_subplots

    k = _headline_k(evaluations[0].report["search"])
    metrics = (f"recall@{k}", f"ndcg@{k}")
    figure = make_subplots(rows=1, cols=2, subplot_titles=(f"Recall@{k}", f"NDCG@{k}"))
    for i, evaluation in enumerate(evaluations):
        search, colour = evaluation.report["search"], PALETTE[i % len(PALETTE)]
        levels = list(search["levels"])
        users = [f"n={search['queried'][level]}" for level in levels]
        label = html.escape(evaluation.label)
        for setting, pattern in SEARCH_SETTINGS.items():
            for system in search["levels"][levels[0]][setting]:
                for col, metric in enumerate(metrics, start=1):
                    figure.add_bar(
                        x=levels, y=[search["levels"][level][setting][system].get(metric, 0.0) for level in levels],
                        text=users, textposition="outside", hovertemplate="%{x}: %{y:.4f} (%{text})",
                        name=f"{label}: {html.escape(system)}, {setting}", legendgroup=f"{i}-{setting}",
                        showlegend=col == 1, marker={"color": colour, "pattern": {"shape": pattern}}, cliponaxis=False,
                        row=1, col=col,
                    )  # fmt: skip
        for system, history_only in search["history_only"].items():
            for col, metric in enumerate(metrics, start=1):
                figure.add_scatter(
                    x=levels, y=[history_only.get(metric, 0.0)] * len(levels), mode="lines",
                    line={"dash": "dash", "color": colour}, name=f"{label}: {html.escape(system)}, history-only",
                    legendgroup=f"{i}-history-only", showlegend=col == 1, row=1, col=col,
                )  # fmt: skip
    figure.update_xaxes(type="category")
    return _layout(figure, 400)


def _sid_figure(evaluations: Sequence[Evaluation]) -> Any:
    from plotly.subplots import make_subplots

    figure = make_subplots(
        rows=1, cols=3, subplot_titles=("codebook utilisation per level", "perplexity per level", "collision rate")
    )
    for i, evaluation in enumerate(evaluations):
        stats, colour = evaluation.report["semantic_ids"], PALETTE[i % len(PALETTE)]
        levels = [f"level {level + 1}" for level in range(int(stats["levels"]))]
        common = {"name": html.escape(evaluation.label), "legendgroup": str(i), "marker_color": colour}
        figure.add_bar(x=levels, y=stats["utilisation"], row=1, col=1, **common)
        figure.add_bar(x=levels, y=stats["perplexity"], row=1, col=2, showlegend=False, **common)
        figure.add_bar(x=["items sharing codes"], y=[stats["collision_rate"]], row=1, col=3, showlegend=False, **common)
        figure.add_scatter(
            x=levels, y=[stats["codebook_size"]] * len(levels), mode="lines", line={"dash": "dot", "color": colour},
            name=f"codebook size ({stats['codebook_size']})", showlegend=i == 0, row=1, col=2,
        )  # fmt: skip
    figure.update_yaxes(range=[0, 1], row=1, col=1)
    figure.update_yaxes(rangemode="tozero", row=1, col=3)
    return _layout(figure, 380)


def _expert_load_figure(evaluations: Sequence[Evaluation]) -> Any:
    from plotly.subplots import make_subplots

    figure = make_subplots(rows=1, cols=2, subplot_titles=("busiest expert / even share, per epoch", "last epoch"))
    for i, evaluation in enumerate(evaluations):
        history, colour = evaluation.report["expert_load"], PALETTE[i % len(PALETTE)]
        common = {"name": html.escape(evaluation.label), "legendgroup": str(i), "marker_color": colour}
        epochs = [row["epoch"] for row in history]
        figure.add_scatter(x=epochs, y=[row["max_over_mean"] for row in history], mode="lines+markers", row=1, col=1,
                           line={"color": colour}, **common)  # fmt: skip
        fractions = history[-1]["fraction"]
        experts = [f"expert {e}" for e in range(len(fractions))]
        figure.add_bar(x=experts, y=fractions, row=1, col=2, showlegend=False, **common)
    figure.update_yaxes(rangemode="tozero")
    return _layout(figure, 360)
