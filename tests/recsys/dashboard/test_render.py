"""The dashboard page from its data: HTML escaping, semantic-ID health, expert load, search slices, distilled students'
labels, item metadata, empty states."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl

from recsys.dashboard import DashboardData, Evaluation, RunSummary, render, render_dashboard
from recsys.dashboard.data import students_beside_teachers
from recsys.enrich.report import metadata_summary
from recsys.evaluation.queries import LEVELS
from recsys.semantic_ids.codes import semantic_id_stats

LISTS = {"keywords": pl.List(pl.String), "queries": pl.List(pl.String)}


def chart_ids(html: str) -> list[str]:
    return re.findall(r'<div id="(chart-[^"]+)" class="plotly-graph-div', html)


def test_run_names_and_slice_names_are_escaped() -> None:
    evil = '<script>alert("x")</script>'
    run = RunSummary("0123456789", evil, evil, "<b>m</b>", "FINISHED", datetime.now(UTC), {"test/ndcg@10": 0.1})
    report = {
        "name": evil, "model": "sasrec", "protocol": {"ks": [10]},
        "slices": {"domain": [{"name": "<img src=x onerror=alert(1)>", "users": 3, "recall@10": 0.5, "ndcg@10": 0.2}]},
        "semantic_ids": None,
    }  # fmt: skip
    html = render_dashboard(DashboardData(evil, evil, [run], [Evaluation(report, evil, "abcdef123")]))
    assert "<script>alert" not in html and "<img src=x" not in html and "<b>m</b>" not in html
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html and "&lt;b&gt;m&lt;/b&gt;" in html


def semantic_id_page() -> str:
    """The page of an evaluation with semantic-ID health (real `semantic_id_stats`) and nothing else."""
    codes = np.random.default_rng(0).integers(0, 8, size=(200, 3))  # 200 items, 3 levels of 8 codes
    report = {"name": "tiny-tiger", "model": "generative", "semantic_ids": semantic_id_stats(codes, 8).to_dict()}
    return render_dashboard(DashboardData("SIDs", "test", runs=[], evaluations=[Evaluation(report, "e", "run1")]))


def test_semantic_id_health_and_empty_states() -> None:
    html = semantic_id_page()
    assert chart_ids(html) == ["chart-semantic-ids"]
    assert "collision rate" in html and "3 levels of 8 codes" in html
    assert "No training runs in test yet" in html and "recsys pipeline run --config" in html  # what to run
    assert "The evaluations have no cold_start slices" in html


def test_expert_load_per_epoch_and_its_empty_state() -> None:
    history = [
        {"epoch": 1, "fraction": [0.55, 0.15, 0.15, 0.15], "max_over_mean": 2.2},
        {"epoch": 2, "fraction": [0.28, 0.24, 0.24, 0.24], "max_over_mean": 1.12},
    ]
    report = {"name": "tiny-ranker", "model": "ranker", "semantic_ids": None, "expert_load": history}
    html = render_dashboard(DashboardData("MoE", "test", runs=[], evaluations=[Evaluation(report, "e", "run1")]))
    assert chart_ids(html) == ["chart-expert-load"]
    assert "busiest expert 1.12x the even share in the last epoch (4 experts)" in html
    assert "No mixture-of-experts head in the evaluated models" in semantic_id_page()


def search_report(name: str) -> dict:
    """A query-aware evaluation's report with the search block of `pipelines.evaluate.search_report`."""
    with_history, alone = {"recall@10": 0.6, "ndcg@10": 0.4}, {"recall@10": 0.5, "ndcg@10": 0.3}
    levels = {level: {"history+query": {"query-aware": with_history}, "no-history": {"query-aware": alone}}
              for level in LEVELS}  # fmt: skip
    queried = {"title-3": 298, "title-1-2": 297, "neighbour-mix": 296}
    history_only = {"query-aware": {"recall@10": 0.2, "ndcg@10": 0.1}}
    search = {"ks": [10], "users": 300, "queried": queried, "history_only": history_only, "levels": levels, "seed": 0}
    return {"name": name, "model": "query_aware", "semantic_ids": None, "search": search}


def test_search_slices_per_level_with_the_history_only_line_and_escaped_names() -> None:
    evil = "<img src=x onerror=alert(1)>"  # (no "/": plotly's JSON writes it \u002f)
    evaluation = Evaluation(search_report(evil), "e", "run1")
    html = render_dashboard(DashboardData("Search", "test", runs=[], evaluations=[evaluation]))
    assert chart_ids(html) == ["chart-search"] and '<section id="search">' in html
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "n=298" in html and "history-only" in html

    figure = render._search_figure([evaluation])
    bars = [trace for trace in figure.data if trace.type == "bar"]
    lines = [trace for trace in figure.data if trace.type == "scatter"]
    assert len(bars) == 4 and len(lines) == 2  # (2 settings, 2 metrics) bars; history-only in both panels
    assert all(list(bar.x) == list(LEVELS) for bar in bars)
    assert (
        list(bars[0].text) == ["n=298", "n=297", "n=296"]
        and bars[0].name == "&lt;img src=x onerror=alert(1)&gt; (query_aware, run1): query-aware, history+query"
    )
    assert list(bars[1].y) == [0.4] * 3 and list(bars[3].y) == [0.3] * 3  # NDCG@10: with the history, without
    assert lines[0].line.dash == "dash" and list(lines[1].y) == [0.1] * 3


def test_search_empty_state_names_the_command() -> None:
    html = semantic_id_page()
    assert "No search evaluation yet" in html and "recsys pipeline run --config configs/beauty/query-aware.yaml" in html


def test_a_distilled_student_is_labelled_with_its_teacher_and_follows_it() -> None:
    distill = {"teacher": "beauty-two-stage", "teacher_dir": "runs/models/beauty-two-stage", "top_k": 50,
               "temperature": 2.0, "alpha": 0.5, "teacher_model_sha256": "0" * 64}  # fmt: skip
    student = Evaluation({"name": "beauty-student", "model": "sasrec", "distill": distill}, "s", "run2")
    other = Evaluation({"name": "beauty-sasrec", "model": "sasrec", "distill": None}, "o", "run3")
    teacher = Evaluation({"name": "beauty-two-stage", "model": "two_stage"}, "t", "run1")
    assert student.label == "beauty-student (sasrec, student of beauty-two-stage, run2)"
    assert other.label == "beauty-sasrec (sasrec, run3)" and other.teacher is None
    assert students_beside_teachers([student, other, teacher]) == [other, teacher, student]
    assert students_beside_teachers([student, other]) == [student, other]  # its teacher not evaluated: in place


def test_item_metadata_section_shows_coverage_failures_and_escaped_examples(tmp_path: Path) -> None:
    records = tmp_path / "item_metadata.parquet"
    evil = "<script>alert(1)</script>"
    pl.DataFrame({
        "item_id": ["a", "b", "c"], "status": ["ok", "ok", "failed"], "category": ["Beauty > Makeup", evil, None],
        "brand": ["Acme", "Zest", None], "keywords": [["lip", "balm", "tint"], ["wash", "body", "gel"], None],
        "description": ["A tinted lip balm.", "A body wash.", None], "queries": [["lip balm", "tint"], ["wash"], None],
        "problem": [None, None, "keywords: Tuple should have at least 3 items"], "truncated": ["", "brand", ""],
        "model": ["gemma@1"] * 3, "prompt_version": ["item-metadata-v1"] * 3,
    }, schema_overrides=LISTS).write_parquet(records)  # fmt: skip
    summary = metadata_summary(records, catalogue_items=4)
    report = {"name": "with-metadata", "model": "sasrec", "semantic_ids": None, "item_metadata": summary}
    html = render_dashboard(DashboardData("Meta", "test", runs=[], evaluations=[Evaluation(report, "e", "run1")]))
    assert '<section id="metadata">' in html and "2 of 4 items with a valid record (coverage 50.0%" in html
    assert "valid 66.7% of 3 answered, 1 with a value cut" in html and "prompt item-metadata-v1" in html
    assert "keywords: Tuple should have at least 3 items (1)" in html
    assert "<td>lip, balm, tint</td>" in html and "<script>alert(1)" not in html and "&lt;script&gt;" in html
    assert "their configs have no enrich section" in semantic_id_page()
