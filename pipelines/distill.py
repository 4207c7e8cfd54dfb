"""Distillation in the train step (an experiment's `distill` section): the teacher's top-K cache of the student's
training targets (`recsys.training.teacher`), kept beside the student's model directory, and the recipe that reads it.

    WORK/models/NAME.teacher-topk/   items.npy, scores.npy, meta.json (its key: the teacher's weights, the training
                                     rows, K and the teacher's history window; another key is recomputed)
"""

from __future__ import annotations

from pathlib import Path

from pipelines.config import ExperimentConfig
from recsys.artifacts.model_dir import load_trained_model, model_sha256
from recsys.data import schema
from recsys.data.prepared import SequenceData
from recsys.errors import ConfigError, RecsysError
from recsys.runtime.device import resolve_device
from recsys.runtime.distributed import Workers, wait_for_everyone
from recsys.training.recipes import DistillationRecipe, NextItemRecipe, Recipe
from recsys.training.teacher import TeacherScoring, TeacherTopK, cached_teacher_topk, teacher_key

TEACHER_KEY = "distill.teacher_dir"  # the config key naming the teacher, for errors


def teacher_cache_path(out_dir: Path) -> Path:
    """The teacher's top-K cache of the student trained into `out_dir`, beside it."""
    return out_dir.with_name(f"{out_dir.name}.teacher-topk")


def distillation_recipe(recipe: Recipe, data: SequenceData, config: ExperimentConfig, out_dir: Path) -> Recipe:
    """`recipe` (the student's next-item one) distilling `config.distill`'s teacher: its top-K cache reused when
    current, else computed on `config.train.hardware.device` (by the first process of a distributed run) and written."""
    settings = config.distill
    assert settings is not None
    if not isinstance(recipe, NextItemRecipe):
        raise ConfigError(f"distill: a {type(recipe).__name__} cannot be distilled. Fix: distil a sasrec or hstu model")
    teacher = load_trained_model(settings.teacher_dir, TEACHER_KEY)[1]
    if teacher.config.num_items != data.num_items:
        raise RecsysError(
            f"{TEACHER_KEY}: {settings.teacher_dir} was trained on {teacher.config.num_items} items, the student's "
            f"data has {data.num_items}. Fix: a teacher trained on the student's data (its config's data section)"
        )
    rows = recipe.trained_rows(data.training_rows())
    candidates = ~data.training_excluded()
    key = teacher_key(model_sha256(settings.teacher_dir, TEACHER_KEY), rows, candidates, settings.top_k,
                      teacher.max_history)  # fmt: skip
    directory = teacher_cache_path(out_dir)
    cache = None
    if Workers.from_environment().is_main:
        scoring = TeacherScoring(key, settings.top_k, candidates, settings.teacher_batch_size)
        teacher = teacher.eval().to(resolve_device(config.train.hardware.device))
        users = data.users[schema.USER_IDX].to_torch().long()
        cache = cached_teacher_topk(directory, teacher, rows, users, scoring)
    wait_for_everyone()  # the other processes of a distributed run read what the first wrote
    cache = cache if cache is not None else TeacherTopK.load(directory, key)
    if cache is None:
        raise RecsysError(f"no teacher cache in {directory} after the first process wrote it. Fix: see its log")
    return DistillationRecipe.create(recipe, cache, settings)
