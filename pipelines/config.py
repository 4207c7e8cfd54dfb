"""Experiment configs: one YAML file -> one typed, frozen `ExperimentConfig`.

A config file is headed by comments stating its purpose, date and the command that runs it
(configs/*.yaml). Unknown keys and wrong types are errors that name the key.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from recsys.errors import ConfigError
from recsys.evaluation import EvalConfig
from recsys.retrieval import IndexConfig
from recsys.semantic_ids.content import ContentConfig
from recsys.semantic_ids.rqkmeans import RQKMeansConfig
from recsys.semantic_ids.rqvae import RQVAEConfig
from recsys.training.trainer import TrainConfig

DEFAULT_TRACKING_URI = "sqlite:///mlruns.db"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataSection(Section):
    """Where the interactions come from and how they are prepared (see `recsys data prepare`)."""

    source: str = "synthetic"
    path: Path | None = None  # raw input (file or directory); None for the synthetic source
    options: dict[str, Any] = Field(default_factory=dict)  # loader options, e.g. num_users for synthetic
    min_interactions: int = 3
    unknown_items: Literal["drop", "keep", "error"] = "drop"
    cold_start_fraction: float = 0.0
    seed: int = 0


class ModelSection(Section):
    """Model name in `recsys.models.registry.CONFIGS` and its config fields (num_items comes from the data)."""

    name: str = "sasrec"
    params: dict[str, Any] = Field(default_factory=dict)


class TrackingSection(Section):
    """MLflow tracking; the URI falls back to $MLFLOW_TRACKING_URI, then a local SQLite file."""

    enabled: bool = True  # false: no MLflow run (e.g. a GPU box without MLflow); the model dir is still written
    uri: str | None = None  # e.g. postgresql+psycopg2://user@host:5432/db for a shared store (docs/pipelines.md)
    experiment: str | None = None  # defaults to the config name
    # artifact location of experiments this creates; None: beside a SQLite file, else MLflow's default (./mlruns)
    artifacts: str | None = None

    def resolved_uri(self) -> str:
        return self.uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


class SidSection(Section):
    """How semantic IDs are built (`configs/*-sid-*.yaml`, section `sid`)."""

    method: Literal["rqvae", "rqkmeans"] = "rqvae"
    # "content": LLM embeddings of the item text; "random": Gaussian vectors of the same size (the ablation
    # that shows what the content is worth)
    vectors: Literal["content", "random"] = "content"
    content: ContentConfig = Field(default_factory=ContentConfig)
    rqvae: RQVAEConfig = Field(default_factory=RQVAEConfig)
    rqkmeans: RQKMeansConfig = Field(default_factory=RQKMeansConfig)
    device: str = "auto"


class RegistrySection(Section):
    """The MLflow registered model a pipeline's bundles become versions of, and the champion gate."""

    model_name: str | None = None  # defaults to the config name
    # a new version becomes `champion` unless its validation NDCG@10 is below the champion's by more than this
    tolerance: float = 0.0


class PipelineSection(Section):
    """What `recsys pipeline run` adds to training: the FAISS index and the registration."""

    index: IndexConfig = IndexConfig()
    registry: RegistrySection = RegistrySection()


class ExperimentConfig(Section):
    name: str
    data: DataSection = DataSection()
    model: ModelSection = ModelSection()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    sid: SidSection | None = None  # semantic IDs to build before training (models that use them)
    tracking: TrackingSection = TrackingSection()
    pipeline: PipelineSection = PipelineSection()

    @property
    def experiment_name(self) -> str:
        return self.tracking.experiment or self.name

    @property
    def registered_model_name(self) -> str:
        return self.pipeline.registry.model_name or self.name


def load_config(path: Path, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Read and validate a YAML experiment config.

    Args:
        path: the YAML file; `name` defaults to the file stem.
        overrides: dotted keys applied on top, e.g. {"train.epochs": 2, "data.path": "x"}.
    """
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found. Fix: pass an existing YAML file, e.g. configs/*.yaml")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err}). Fix: correct the syntax at the position shown") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections. Fix: see configs/*.yaml")
    raw.setdefault("name", path.stem)
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"{path}: {problems}. Fix: correct these keys (see configs/*.yaml)") from err


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value
