"""Distillation through the pipeline: a tiny SASRec teacher, a smaller SASRec student trained on its top-K, written,
indexed and registered like any retriever; the teacher's cache reused while current; its evaluation recording its
teacher, beside the teacher's on the dashboard."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines.config import ExperimentConfig, load_config
from pipelines.distill import teacher_cache_path
from recsys.artifacts.model_dir import load_model_dir, model_sha256
from tests.conftest import train_experiment, write_tiny_config

STUDENT = {"name": "sasrec", "params": {"max_history": 20, "dim": 16, "num_heads": 1, "ffn_dim": 32}}


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> tuple[Path, Path]:
    work = tmp_path_factory.mktemp("distill")
    train_experiment(load_config(tiny_config(work, train={"schedule": {"epochs": 2}})), work)
    return work, work / "models" / "tiny-sasrec"


def _student(work: Path, teacher_dir: Path, **distill: object) -> ExperimentConfig:
    settings = {"teacher_dir": str(teacher_dir), "top_k": 10, "temperature": 2.0, "alpha": 0.5, **distill}
    path = write_tiny_config(
        work, name="tiny-student", model=STUDENT, train={"schedule": {"epochs": 2}}, distill=settings
    )
    return load_config(path)


def test_student_is_trained_written_indexed_and_registered(teacher: tuple[Path, Path]) -> None:
    from pipelines.runner import run_pipeline

    work, teacher_dir = teacher
    outputs, reports = run_pipeline(_student(work, teacher_dir), work)
    assert {r.name: r.status for r in reports}["register"] == "ran"
    assert outputs.index is not None and outputs.registration is not None
    student = load_model_dir(work / "models" / "tiny-student")
    assert student.name == "sasrec" and student.model.config.dim == 16
    assert student.metrics["valid"]["ndcg@10"] > 0
    meta = json.loads((teacher_cache_path(work / "models" / "tiny-student") / "meta.json").read_text())
    assert meta["top_k"] == 10 and meta["positions"] == len(student.data.training_sequences().values)


def test_unchanged_run_skips_and_a_new_k_recomputes_the_cache(teacher: tuple[Path, Path]) -> None:
    from pipelines.runner import run_pipeline

    work, teacher_dir = teacher
    config = _student(work, teacher_dir)
    run_pipeline(config, work, until="train_retriever")
    cache = teacher_cache_path(work / "models" / "tiny-student") / "items.npy"
    written = cache.stat().st_mtime_ns
    _, reports = run_pipeline(config, work, until="train_retriever")
    assert reports[-1].status == "skipped"
    assert cache.stat().st_mtime_ns == written
    _, reports = run_pipeline(_student(work, teacher_dir, top_k=5), work, until="train_retriever")
    assert reports[-1].status == "ran"
    meta = json.loads((cache.parent / "meta.json").read_text())
    assert meta["top_k"] == 5


def test_a_student_must_be_a_next_item_model(teacher: tuple[Path, Path]) -> None:
    from recsys.errors import ConfigError

    work, teacher_dir = teacher
    with pytest.raises(ConfigError, match=r"distill: the student must be a next-item model.*Fix"):
        load_config(
            write_tiny_config(
                work, model={"name": "two_tower", "params": {}}, distill={"teacher_dir": str(teacher_dir)}
            )
        )


def test_teacher_and_student_evaluated_into_one_store_side_by_side(teacher: tuple[Path, Path]) -> None:
    from pipelines.runner import run_pipeline
    from recsys.dashboard import from_mlflow, render_dashboard

    work, teacher_dir = teacher
    run_pipeline(
        load_config(write_tiny_config(work, train={"schedule": {"epochs": 2}})), work
    )  # the teacher's own pipeline
    outputs, _ = run_pipeline(_student(work, teacher_dir, temperature=3.0), work)
    assert outputs.evaluation is not None
    report = json.loads((outputs.evaluation.evaluation_dir / "evaluation.json").read_text())
    assert report["distill"] == {
        "teacher": "tiny-sasrec", "teacher_dir": str(teacher_dir), "teacher_model_sha256": model_sha256(teacher_dir),
        "top_k": 10, "temperature": 3.0, "alpha": 0.5,
    }  # fmt: skip

    data = from_mlflow(f"sqlite:///{work / 'mlflow.db'}")  # both experiments' latest evaluations, teacher first
    assert [(e.name, e.teacher) for e in data.evaluations] == [("tiny-sasrec", None), ("tiny-student", "tiny-sasrec")]
    assert "student of tiny-sasrec" in data.evaluations[1].label
    assert "student of tiny-sasrec" in render_dashboard(data)
