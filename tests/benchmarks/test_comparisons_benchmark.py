"""The comparisons benchmark end to end on its smoke config: one seed run on its own first (--only-seed, its models
side by side in processes of their own), then every model and seed trained and evaluated, each pair's paired
difference per seed and pooled (overall and on a slice's users); a second run reuses what the work dir holds;
Beauty's ranker runs over the SASRec of its own seed, a student learns from the ranker of its own seed."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

import benchmarks.comparisons as comparisons
from benchmarks.common import REPO
from benchmarks.reproduce import problems_of
from pipelines.recovery import LOCK_FILE
from pipelines.steps.base import ExperimentPaths
from recsys.errors import ConfigError
from recsys.runtime.lock import LockHeldError, exclusive_lock

SMOKE = "benchmarks/configs/comparisons-smoke.yaml"


def test_the_smoke_comparisons_give_every_pair_its_interval_per_seed(tmp_path: Path) -> None:
    argv = ["--config", SMOKE, "--set", f"work_dir={tmp_path / 'work'}", "--results-dir", str(tmp_path)]
    # a seed on its own, its two models side by side in processes of their own: no result yet
    assert comparisons.main([*argv, "--only-seed", "1", "--side-by-side", "2"]) == tmp_path / "work"
    assert not (tmp_path / "comparisons-smoke.json").exists()
    logs = sorted(path.name for path in (tmp_path / "work" / "logs").iterdir())
    assert logs == ["sasrec-seed1.log", "sasrec-small-seed1.log"]
    models = tmp_path / "work" / "models"
    comparisons.main([*argv, "--only-seed", "0", "--only-model", "SASRec small"])  # one run: one process per run
    trained = {path.parent.name for path in models.glob("*/model.pt")}
    assert trained == {"smoke-sasrec-seed1", "smoke-sasrec-small-seed1", "smoke-sasrec-small"}
    with pytest.raises(SystemExit, match=r"--only-model 'SASrec' is not a model of the config. Fix: one of"):
        comparisons.main([*argv, "--only-model", "SASrec"])
    seed1 = models / "smoke-sasrec-seed1" / "model.pt"
    seed1_trained = seed1.stat().st_mtime_ns
    path = comparisons.main(argv)
    assert path == tmp_path / "comparisons-smoke.json" and problems_of(path) == []
    assert seed1.stat().st_mtime_ns == seed1_trained  # the gathering run reused it
    result = json.loads(path.read_text())
    assert list(result["models"]) == ["SASRec", "SASRec small"]
    for record in result["models"].values():
        n10 = record["ndcg@10"]
        assert n10["seeds"] == 2 and len(n10["per_seed"]) == 2 and n10["std"] >= 0
        assert all(low <= seed["value"] <= high for seed in n10["per_seed"] for low, high in [seed["interval"]])
    assert result["models"]["SASRec"]["configs"] == ["smoke-sasrec", "smoke-sasrec-seed1"]
    (pair,) = result["pairs"]
    assert (pair["a"], pair["b"], pair["metric"]) == ("SASRec", "SASRec small", "ndcg@10")
    a, b = (result["models"][label]["ndcg@10"]["per_seed"] for label in ("SASRec", "SASRec small"))
    for seed, paired in enumerate(pair["per_seed"]):
        assert paired["difference"] == pytest.approx(a[seed]["value"] - b[seed]["value"])
        assert paired["low"] <= paired["difference"] <= paired["high"] and 0 < paired["p_value"] <= 1
    assert (
        pair["pooled"]["seeds"] == 2 and 0 <= pair["pooled"]["seeds_a_better"] + pair["pooled"]["seeds_b_better"] <= 2
    )

    models = tmp_path / "work" / "models" / "smoke-sasrec"
    trained = (models / "model.pt").stat().st_mtime_ns
    sliced = json.loads(comparisons.main([*argv, "--set", "pair_metrics=[ndcg@10, warm.recall@10]"]).read_text())
    assert (models / "model.pt").stat().st_mtime_ns == trained  # resumable: nothing is trained again
    overall, warm = sliced["pairs"]
    assert overall["per_seed"] == pair["per_seed"] and warm["metric"] == "warm.recall@10"
    assert all(0 < seed["users"] <= overall["per_seed"][0]["users"] for seed in warm["per_seed"])
    with pytest.raises(ConfigError, match=r"no slice \['frozen'\] in the evaluations. Fix: one of \[.*'warm'"):
        comparisons.main([*argv, "--set", "pair_metrics=[frozen.ndcg@10]"])

    metrics = "model_metrics=[ndcg@10, warm.recall@10, valid.ndcg@10, train.seconds_per_epoch, coverage@10]"
    referenced = json.loads(comparisons.main([*argv, "--set", metrics, "--set", "pairs_with=SASRec"]).read_text())
    (reversed_pair,) = referenced["pairs"]  # each model minus the reference
    assert (reversed_pair["a"], reversed_pair["b"]) == ("SASRec small", "SASRec")
    record = referenced["models"]["SASRec"]
    trained = json.loads((models / "metrics.json").read_text())
    assert record["valid.ndcg@10"]["per_seed"][0] == {"value": trained["valid"]["ndcg@10"]}
    assert record["train.seconds_per_epoch"]["per_seed"][0] == {"value": trained["seconds_per_epoch"]} and (
        trained["seconds_per_epoch"] > 0
    )
    assert record["coverage@10"]["per_seed"][0] == {"value": trained["test"]["coverage@10"]}  # a list's: no interval
    low, high = record["warm.recall@10"]["per_seed"][0]["interval"]
    assert low <= record["warm.recall@10"]["per_seed"][0]["value"] <= high
    with pytest.raises(SystemExit, match=r"no 'valid_cold' 'ndcg@10'.*cold-start split"):
        comparisons.main([*argv, "--set", "model_metrics=[valid_cold.ndcg@10]"])
    with pytest.raises(SystemExit, match=r"no timing 'seconds'\. Fix: one of \[.*'train\.time_to_first_step_s'"):
        comparisons.main([*argv, "--set", "model_metrics=[train.seconds]"])


def test_a_side_by_side_run_queues_behind_another_process_training_the_same_model(tmp_path: Path) -> None:
    argv = ["--config", SMOKE, "--set", f"work_dir={tmp_path}", "--only-seed", "0", "--only-model", "SASRec"]
    settings = comparisons.load_settings(REPO / SMOKE, {"work_dir": str(tmp_path)})
    config = comparisons.model_config(settings, settings.models[0], 0, tmp_path)
    lock = ExperimentPaths.under(tmp_path, config).pipeline_dir / LOCK_FILE
    taken, release = threading.Event(), threading.Event()

    def sibling() -> None:  # another run holding the pipeline (flock: a second descriptor conflicts in-process too)
        with exclusive_lock(lock, what="held by the test", fix="-"):
            taken.set()
            release.wait(timeout=60)

    holder = threading.Thread(target=sibling)
    holder.start()
    try:
        assert taken.wait(timeout=10)
        with pytest.raises(LockHeldError, match=r"pipeline smoke-sasrec under .* is being run by pid \d+"):
            comparisons.main([*argv, "--wait", "0"])
        threading.Timer(1.0, release.set).start()  # the sibling finishes while this run waits
        comparisons.main([*argv, "--wait", "60"])
    finally:
        release.set()
        holder.join()
    assert (tmp_path / "models" / "smoke-sasrec" / "model.pt").exists()


def test_a_model_run_on_its_own_brings_the_retrievers_it_is_built_on() -> None:
    ranker = comparisons.Model("ranker", "r.yaml", retriever="retriever", holdout_retriever="held out")
    held_out = comparisons.Model("held out", "h.yaml", retriever="retriever")  # built on the retriever too
    models = [comparisons.Model("retriever", "a.yaml"), comparisons.Model("other", "b.yaml"), held_out, ranker]
    assert [m.label for m in comparisons.built_on(models, "ranker")] == ["retriever", "held out", "ranker"]
    assert [m.label for m in comparisons.built_on(models, "other")] == ["other"]


def test_side_by_side_runs_start_with_the_models_others_are_built_on() -> None:
    settings = comparisons.load_settings(REPO / "benchmarks/configs/beauty-comparisons.yaml", {})
    units = comparisons.side_by_side_units(settings, range(2), ["two-stage", "SASRec"], ["cmd"], Path("/w"))
    assert [unit.name for unit in units] == ["SASRec seed 0", "SASRec seed 1", "two-stage seed 0", "two-stage seed 1"]
    assert units[2].command == ["cmd", "--only-model", "two-stage", "--only-seed", "0", "--side-by-side", "1"]
    assert units[2].log == Path("/w/logs/two-stage-seed0.log")
    alike = comparisons.side_by_side_units(settings, [0], ["SASRec", "SASRec + SID features"], ["cmd"], Path("/w"))
    assert [unit.log.name for unit in alike] == ["sasrec-seed0.log", "sasrec-sid-features-seed0.log"]
    assert comparisons._log_names(["SASRec small", "sasrec-small", "SASRec  small"]) == {
        "SASRec small": "sasrec-small", "sasrec-small": "sasrec-small-2", "SASRec  small": "sasrec-small-3"
    }  # fmt: skip


def test_the_beauty_ranker_reads_the_sasrec_of_its_seed() -> None:
    settings = comparisons.load_settings(REPO / "benchmarks/configs/beauty-comparisons.yaml", {"device": "cuda"})
    assert [m.label for m in settings.models] == ["SASRec", "SASRec + SID features", "two-stage"]
    work = Path("/work-dir")
    two_stage = comparisons.model_config(settings, settings.models[2], 1, work)
    assert two_stage.name == "beauty-two-stage-seed1" and two_stage.train.seed == 1
    assert two_stage.model.upstream_dirs() == {"retriever": work / "models" / "beauty-sasrec-seed1"}
    assert two_stage.train.hardware.device == "cuda" and two_stage.eval.uncertainty.resamples == 1000
    assert comparisons.model_config(settings, settings.models[2], 0, work).model.upstream_dirs() == {
        "retriever": work / "models" / "beauty-sasrec"
    }


def test_a_beauty_student_learns_from_the_ranker_of_its_seed() -> None:
    settings = comparisons.load_settings(REPO / "benchmarks/configs/beauty-ranking.yaml", {})
    by_label = {model.label: model for model in settings.models}
    work = Path("/work-dir")
    student = comparisons.model_config(settings, by_label["student wide"], 2, work)
    assert student.name == "beauty-distill-ranker-wide-seed2" and student.distill is not None
    assert student.distill.teacher_dir == work / "models" / "beauty-ranker-residual-moe-seed2"
    ranker = comparisons.model_config(settings, by_label["ranker MoE"], 2, work)
    assert ranker.model.upstream_dirs() == {
        "retriever": work / "models" / "beauty-sasrec-seed2",
        "holdout_retriever": work / "models" / "beauty-sasrec-holdout-seed2",
    }
    chain = [model.label for model in comparisons.built_on(settings.models, "student wide")]
    assert chain == ["SASRec", "SASRec held out", "ranker MoE", "student wide"]  # run on its own, in this order


def test_models_that_read_queries_are_compared_on_search_user_by_user(tmp_path: Path) -> None:
    config = "benchmarks/configs/comparisons-search-smoke.yaml"
    argv = ["--config", config, "--set", f"work_dir={tmp_path / 'work'}", "--results-dir", str(tmp_path)]
    result = json.loads(comparisons.main(argv).read_text())
    record = result["models"]["query-aware"]["search"]
    assert record["title-3/no-history"]["seeds"] == 2 and 0 < record["title-3/no-history"]["mean"] <= 1
    (pair,) = result["search_pairs"]
    levels = pair["levels"]
    assert {"history-only", "title-3/no-history", "neighbour-mix/history+query"} <= set(levels)
    per_model = {label: result["models"][label]["search"]["title-1-2/no-history"]["per_seed"]
                 for label in ("query-aware", "query-aware small")}  # fmt: skip
    for seed, paired in enumerate(levels["title-1-2/no-history"]["per_seed"]):
        assert paired["users"] > 0 and paired["low"] <= paired["difference"] <= paired["high"]
        expected = per_model["query-aware"][seed] - per_model["query-aware small"][seed]
        assert paired["difference"] == pytest.approx(expected)  # the same users: the difference of the means


def test_a_models_tasks_are_summarised_over_its_seeds() -> None:
    seeds = [
        {"category_l2": {"accuracy": 0.4, "majority_accuracy": 0.3, "users": 10.0}},
        {"category_l2": {"accuracy": 0.6, "majority_accuracy": 0.3, "users": 10.0}},
    ]
    summary = comparisons.tasks_over_seeds(seeds)
    assert set(summary["category_l2"]) == {"accuracy", "majority_accuracy"}  # users is a count, not a measure
    assert summary["category_l2"]["accuracy"]["mean"] == pytest.approx(0.5)
    assert summary["category_l2"]["accuracy"]["per_seed"] == [0.4, 0.6]
    assert summary["category_l2"]["majority_accuracy"]["std"] == pytest.approx(0.0)


def test_a_ranker_with_model_sources_reads_the_extra_retrievers_of_its_seed() -> None:
    settings = comparisons.load_settings(comparisons.REPO / "benchmarks/configs/beauty-multi-source-cold.yaml", {})
    by_label = {model.label: model for model in settings.models}
    work = Path("/work")
    ranker = comparisons.model_config(settings, by_label["ranker sources + HSTU"], 1, work)
    assert ranker.model.upstream["extra_retrievers"] == [str(work / "models" / "beauty-hstu-seed1")]
    assert ranker.model.upstream["extra_holdout_retrievers"] == [str(work / "models" / "beauty-hstu-holdout-seed1")]
    assert [m.label for m in comparisons.built_on(settings.models, "ranker sources + HSTU")] == [
        "SASRec", "SASRec held out", "HSTU", "HSTU held out", "ranker sources + HSTU"
    ]  # fmt: skip
