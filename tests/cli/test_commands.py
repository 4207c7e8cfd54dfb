"""The `recsys` command line, end to end on the tiny synthetic data (real MLflow SQLite store)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from recsys.data.prepared import load_prepared

runner = CliRunner()


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> Path:
    work = tmp_path_factory.mktemp("cli")
    result = runner.invoke(app, ["train", "--config", str(tiny_config(work)), "--work-dir", str(work)])
    assert result.exit_code == 0, result.output
    assert "N@10" in result.output
    return work / "models" / "tiny-sasrec"


def test_evaluate_prints_the_metrics_table(trained_dir: Path) -> None:
    result = runner.invoke(app, ["evaluate", "--model-dir", str(trained_dir), "--split", "valid"])
    assert result.exit_code == 0, result.output
    assert "R@10" in result.output


def test_evaluate_in_item_blocks_prints_the_whole_catalogue_numbers(trained_dir: Path) -> None:
    whole = runner.invoke(app, ["evaluate", "--model-dir", str(trained_dir), "--item-block", "0"])
    blocked = runner.invoke(app, ["evaluate", "--model-dir", str(trained_dir), "--item-block", "7"])
    assert whole.exit_code == 0 and blocked.exit_code == 0, whole.output + blocked.output
    assert blocked.stdout == whole.stdout  # the tables; the log (stderr) has timings


def test_evaluate_a_user_sample_labels_it(trained_dir: Path) -> None:
    result = runner.invoke(app, ["evaluate", "--model-dir", str(trained_dir), "--users", "20", "--seed", "3"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # the long title may wrap
    assert "SAMPLE of 20 of 300 users (seed 3), not the full protocol" in text and "R@10" in text
    again = runner.invoke(app, ["evaluate", "--model-dir", str(trained_dir), "--users", "20", "--seed", "3"])
    assert again.stdout == result.stdout
    result = runner.invoke(app, ["evaluate", "--model-dir", str(trained_dir), "--seed", "3"])
    assert result.exit_code == 2 and "Fix: add --users N" in result.output


def test_evaluate_past_its_budget_exits_2_naming_the_knob(trained_dir: Path) -> None:
    memory = runner.invoke(app, ["evaluate", "--model-dir", str(trained_dir), "--max-memory-gb", "0.01"])
    assert memory.exit_code == 2
    assert memory.stderr.startswith("error: evaluation: holds ")
    assert "Fix: raise --max-memory-gb (eval.max_memory_gb in a config), or lower eval.batch_size" in memory.stderr
    time = runner.invoke(app, ["evaluate", "--model-dir", str(trained_dir), "--max-seconds", "1e-9"])
    assert time.exit_code == 2
    assert "over its time budget of 1e-09 s" in time.stderr and "Fix: raise --max-seconds" in time.stderr
    within = ["--max-seconds", "600", "--max-memory-gb", "1000"]
    assert runner.invoke(app, ["evaluate", "--model-dir", str(trained_dir), *within]).exit_code == 0


def test_recommend_shows_titles_for_a_known_user(trained_dir: Path) -> None:
    result = runner.invoke(app, ["recommend", "--model-dir", str(trained_dir), "--user", "u00001", "--k", "5"])
    assert result.exit_code == 0, result.output
    assert "recommended next" in result.output
    assert result.output.count("\n") > 8


def test_unknown_user_and_bad_split_exit_2_with_a_fix(trained_dir: Path) -> None:
    result = runner.invoke(app, ["recommend", "--model-dir", str(trained_dir), "--user", "nobody"])
    assert result.exit_code == 2
    assert "unknown user 'nobody'" in result.output and "Fix:" in result.output
    result = runner.invoke(app, ["evaluate", "--model-dir", str(trained_dir), "--split", "train"])
    assert result.exit_code == 2 and "--split valid or --split test" in result.output


def test_missing_model_dir_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["evaluate", "--model-dir", str(tmp_path)])
    assert result.exit_code == 2 and "not a model directory" in result.output


def test_demo_runs_end_to_end(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    config = tiny_config(tmp_path, train={"schedule": {"epochs": 2}})
    demo = ["demo", "--out", str(tmp_path / "demo"), "--config", str(config)]
    result = runner.invoke(app, demo, env={"COLUMNS": "200"})  # wide enough for the tables' cells on one line
    assert result.exit_code == 0, result.output
    assert "popularity" in result.output and "sasrec" in result.output
    assert "registered tiny-sasrec v1: first champion: beats the popularity baseline: " in result.output
    assert "online API up on http://127.0.0.1:" in result.output
    assert result.output.count("POST /v1/recommendations user") == 3
    assert "(source: popularity)" in result.output and "after POST /v1/events" in result.output
    query = load_prepared(tmp_path / "demo" / "data" / "tiny-sasrec").items.row(0, named=True)
    similar = result.output[result.output.index(f"GET /v1/similar-items/{query['item_id']}") :]
    assert "items similar to" in similar and f"{query['title']} ({query['item_id']})" in similar  # the query item
    assert "similar items" in similar and "recommended next" not in similar  # the list is headed as what it is
    # the dashboard was fetched from the live API: the comparison (popularity vs SASRec), the trend (one evaluation)
    # and the 4 slice charts
    assert re.search(r"evaluation dashboard: http://127\.0\.0\.1:\d+/dashboard \(6 charts", result.output)


def test_sid_build_writes_unique_ids_and_prints_health(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    sid = {"method": "rqkmeans", "rqkmeans": {"levels": 2, "codebook_size": 8}}
    config = tiny_config(tmp_path, sid=sid)
    result = runner.invoke(app, ["sid", "build", "--config", str(config), "--work-dir", str(tmp_path / "w")])
    assert result.exit_code == 0, result.output
    assert "collision_rate" in result.output
    from recsys.semantic_ids.codes import read_semantic_ids

    sids, stats = read_semantic_ids(tmp_path / "w" / "sids" / "tiny-sasrec" / "semantic_ids.parquet")
    assert len({tuple(row) for row in sids.codes[1:].tolist()}) == sids.num_items
    assert all(0 < u <= 1 for u in stats.utilisation)


def test_sid_build_without_a_sid_section_exits_2(tmp_path: Path, tiny_config: Callable[..., Path]) -> None:
    result = runner.invoke(app, ["sid", "build", "--config", str(tiny_config(tmp_path))])
    assert result.exit_code == 2 and "no `sid` section" in result.output


def test_evaluate_compare_prints_the_paired_differences_and_writes_them_beside(
    trained_dir: Path, tiny_config: Callable[..., Path]
) -> None:
    work = trained_dir.parents[1]
    other = ["train", "--config", str(tiny_config(work)), "--work-dir", str(work), "--epochs", "1",
             "--set", "name=tiny-other", "--set", "train.seed=1"]  # fmt: skip
    assert runner.invoke(app, other).exit_code == 0
    other_dir = work / "models" / "tiny-other"
    result = runner.invoke(app, ["evaluate", "--model-dir", str(trained_dir), "--compare", str(other_dir)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "tiny-sasrec vs tiny-other on test, 300 users" in text
    assert all(header in text for header in ("difference", "95% interval", "p-value", "N@10"))
    written = work / "models" / "tiny-sasrec.vs-tiny-other.test.json"
    assert f"comparison: {written}" in text
    comparison = json.loads(written.read_text())
    assert comparison["challenger"] == "tiny-sasrec" and comparison["champion"] == "tiny-other"
    assert comparison["users"] == 300 and comparison["sample"] is None
    paired = comparison["overall"]["ndcg@10"]
    shown = f"{paired['difference']:+.4f} │ [{paired['low']:+.4f},"  # (the interval may wrap in 80 columns)
    assert re.search(rf"N@10 .*{re.escape(shown)}", text) and f"{paired['high']:+.4f}]" in text
    assert set(comparison["slices"]) >= {"cold_start", "popularity_decile", "history_length"}

    missing = runner.invoke(app, ["evaluate", "--model-dir", str(trained_dir), "--compare", str(work / "nope")])
    assert missing.exit_code == 2 and "is not a model directory" in missing.stderr


def test_train_data_dir_takes_a_prepared_directory_or_the_sources_raw_input(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    from features.export import write_p5
    from features.prepare import prepare
    from features.sources import open_source

    prepared = tmp_path / "prepared"
    prepare(open_source("synthetic", None, num_users=60, num_items=40), prepared)
    raw = write_p5(prepared, tmp_path / "raw" / "amazon-synthetic").out_dir
    config = tiny_config(tmp_path, data={"source": "amazon-p5", "options": {}})  # no data.path: --data-dir gives it
    for data_dir, note in ((raw, "is not a prepared directory (no meta.json): read as the raw input"), (prepared, "")):
        work = tmp_path / f"work-{data_dir.name}"
        command = ["train", "--config", str(config), "--work-dir", str(work), "--epochs", "1", "--data-dir"]
        result = runner.invoke(app, [*command, str(data_dir)])
        assert result.exit_code == 0, result.output
        assert (note in result.stderr) if note else "prepared directory" not in result.stderr
        assert (work / "models" / "tiny-sasrec").is_dir()


def _cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _without(key: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_text(json.dumps({k: v for k, v in json.loads(path.read_text()).items() if k != key}))

    return write


@pytest.mark.parametrize(
    ("file", "corrupt", "message", "options"),
    [
        ("data.json", _cut_short, "not valid JSON: it ends in the middle of a value (cut short?)", []),
        ("data.json", lambda p: p.write_text("[]"), "holds a JSON list, not the object expected", []),
        ("data.json", _without("data_dir"), "not a model's data.json of this version (data_dir: Field required)", []),
        ("metrics.json", lambda p: p.write_bytes(b"\xff\xfe{}"), "not UTF-8 text (byte 0 is 0xff)", []),
        ("metrics.json", _without("test"), "not a model's metrics.json of this version (test: Field required)", []),
        ("model.pt", _cut_short, "not a model file this version reads", []),
        ("config.yaml", lambda p: p.write_text("name: [unclosed"), "not valid YAML", ["--compare"]),
        ("config.yaml", lambda p: p.write_text("- a list"), "holds a YAML list", ["--compare"]),
    ],
)
def test_evaluate_of_a_model_dir_with_a_corrupt_file_exits_2_naming_it(
    trained_dir: Path,
    tmp_path: Path,
    file: str,
    corrupt: Callable[[Path], None],
    message: str,
    options: list[str],
) -> None:
    import shutil

    model_dir = Path(shutil.copytree(trained_dir, tmp_path / "model"))
    corrupt(model_dir / file)
    compare = [*options, str(trained_dir)] if options else []
    result = runner.invoke(app, ["evaluate", "--model-dir", str(model_dir), "--users", "20", *compare])
    assert result.exit_code == 2, result.output
    error = " ".join(result.stderr[result.stderr.index("error: ") :].split())  # after the log's lines
    assert error.startswith(f"error: {model_dir / file}: {message}") and "Fix: train the model again" in error
    assert "Traceback" not in result.output
