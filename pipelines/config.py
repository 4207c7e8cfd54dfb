"""Experiment configs: one YAML file -> one typed, frozen `ExperimentConfig`.

A config file is headed by comments stating its purpose, date and the command that runs it (configs/*/*.yaml).
`base: other.yaml` (a path relative to the file) makes it extend another config: the base's sections are merged
key by key with the file's own (a mapping merges, any other value replaces), so a variant states only what it
changes; a `model` section naming another model replaces the base's whole (another model's settings do not
apply). `name` is never inherited; it defaults to `<dataset>-<stem>` for configs/<dataset>/<stem>.yaml and to
the stem elsewhere. What a config leaves out takes the defaults, but a config must set something: an empty file is
an error, not a run of the default model on the default data. Unknown keys, wrong types and impossible values
(`model.params` included, checked against the model's config before any data is read) are errors that name the
dotted key and the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator

from features.prepare import DEFAULT_MEMORY_BUDGET_GB
from pipelines.tracking import resolve_tracking_uri
from recsys.errors import ConfigError
from recsys.evaluation import EvalConfig
from recsys.models.registry import check_params, model_spec
from recsys.retrieval import IndexConfig
from recsys.runtime.validation import config_from, problems
from recsys.semantic_ids.content import ContentConfig
from recsys.semantic_ids.rqkmeans import RQKMeansConfig
from recsys.semantic_ids.rqvae import RQVAEConfig
from recsys.training.recipes import TRAINING_SETTINGS, DistillConfig, NextItemTraining, TrainingSettings
from recsys.training.trainer import TrainConfig

BASE_KEY = "base"
CONFIGS_DIR = "configs"


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
    # the memory the prepare may use (GiB): it sizes the batches large inputs are read in, not what is prepared
    memory_budget_gb: float = Field(default=DEFAULT_MEMORY_BUDGET_GB, gt=0)
    # multi-domain data: train and evaluate on this domain's users and items only (the catalog's indices stay)
    domain: str | None = None
    # next-item models: training reads the prepared parts this many at a time (its shuffle buffer) instead of every
    # sequence at once (`recsys.data.prepared.PreparedParts`); None = all in memory. Evaluation reads the data whole.
    stream_parts: PositiveInt | None = None


class ModelSection(Section):
    """The model: its registry name (`recsys.models.registry.MODELS`), its config fields (num_items comes from the
    data), its family's training settings (`recsys.training.recipes`), and the trained models it is built on."""

    name: str = "sasrec"
    params: dict[str, Any] = Field(default_factory=dict)
    training: dict[str, Any] = Field(default_factory=dict)
    retriever_dir: Path | None = None  # ranker: the model directory of its first stage
    # ranker training: a first stage trained without each user's last items (its model.training.holdout_last)
    holdout_retriever_dir: Path | None = None
    base_dir: Path | None = None  # domain_adapters: the model directory of the SASRec of every domain
    members: list[Path] = Field(default_factory=list)  # fusion: the model directories of the retrievers to fuse

    @model_validator(mode="after")
    def _known_model_params_and_training(self) -> ModelSection:
        """Fail at load time, naming the key, rather than after the data is prepared or when training starts."""
        try:
            model_spec(self.name)
        except ConfigError as err:
            raise ConfigError(f"model.name: {err}") from err
        check_params(self.name, self.params)
        self.training_settings()
        return self

    def training_settings(self) -> TrainingSettings:
        """`training`, validated against the model family's settings."""
        family = model_spec(self.name).training_family
        try:
            return config_from(TRAINING_SETTINGS[family], self.training, "model.training.")
        except ConfigError as err:
            raise ConfigError(f"{err}. Fix: use the {self.name} model's training settings (docs/training.md)") from err

    def upstream_dirs(self) -> dict[str, Path]:
        """Every model directory this model is built on, by role (what its fingerprint depends on)."""
        roles = {
            "retriever": self.retriever_dir,
            "holdout_retriever": self.holdout_retriever_dir,
            "base": self.base_dir,
        }
        found = {role: path for role, path in roles.items() if path is not None}
        return found | {f"member{i}": path for i, path in enumerate(self.members)}


class TrackingSection(Section):
    """MLflow tracking; the URI falls back to $MLFLOW_TRACKING_URI, then a local SQLite file."""

    enabled: bool = True  # false: no MLflow run (e.g. a GPU box without MLflow); the model dir is still written
    uri: str | None = None  # e.g. postgresql+psycopg2://user@host:5432/db for a shared store (docs/pipelines.md)
    experiment: str | None = None  # defaults to the config name
    # artifact location of experiments this creates; None: beside a SQLite file, else MLflow's default (./mlruns)
    artifacts: str | None = None

    def resolved_uri(self) -> str:
        return resolve_tracking_uri(self.uri)


class SidSection(Section):
    """How semantic IDs are built (section `sid`)."""

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
    # strict: a new version becomes `champion` only when the paired difference of validation NDCG@10 against the
    # champion (same users) has its whole interval (eval.uncertainty) above 0; point: when its validation NDCG@10 is
    # not below the champion's by more than `tolerance` (pipelines/registry.py, docs/pipelines.md)
    gate: Literal["strict", "point"] = "strict"
    tolerance: float = 0.0  # of the point rule (and of strict's fallback to it)


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
    distill: DistillConfig | None = None  # train the model as a student of a teacher (docs/training.md)

    @model_validator(mode="after")
    def _distils_a_next_item_model(self) -> ExperimentConfig:
        """A student is a next-item model trained on the whole data in memory (its teacher's cache covers it)."""
        if self.distill is None:
            return self
        if type(self.model.training_settings()) is not NextItemTraining:
            raise ConfigError(
                f"distill: the student must be a next-item model (sasrec, hstu), not {self.model.name!r}. "
                "Fix: set model.name: sasrec (its serving size in model.params), or remove the distill section"
            )
        if self.data.stream_parts is not None:
            raise ConfigError(
                "distill: the teacher's cache covers the training rows in memory. Fix: remove data.stream_parts"
            )
        return self

    @model_validator(mode="after")
    def _strict_gate_has_intervals(self) -> ExperimentConfig:
        if self.pipeline.registry.gate == "strict" and not self.eval.uncertainty.resamples:
            raise ConfigError(
                "pipeline.registry.gate: strict compares with the champion by an interval, and "
                "eval.uncertainty.resamples is 0. Fix: set resamples (e.g. 1000), or pipeline.registry.gate: point"
            )
        return self

    @property
    def experiment_name(self) -> str:
        return self.tracking.experiment or self.name

    @property
    def registered_model_name(self) -> str:
        return self.pipeline.registry.model_name or self.name


def load_config(path: Path, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """Read and validate a YAML experiment config (with the configs it extends).

    Args:
        path: the YAML file.
        overrides: dotted keys applied on top, e.g. {"train.epochs": 2, "data.path": "x"}.
    """
    raw = read_config_tree(path)
    if not raw.keys() - {"name"}:
        raise ConfigError(
            f"{path}: the config sets nothing (no data, model or train section). Fix: state what to run, e.g. start "
            "from configs/synthetic/sasrec.yaml, or extend a config with `base: <its path>`"
        )
    raw.setdefault("name", default_name(path))
    for dotted, value in (overrides or {}).items():
        set_dotted(raw, dotted, value)
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{path}: {problems(err)}. Fix: correct these keys (see configs/*/*.yaml)") from err
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err


def default_name(path: Path) -> str:
    """`<dataset>-<stem>` for configs/<dataset>/<stem>.yaml, else the stem."""
    return f"{path.parent.name}-{path.stem}" if path.parent.parent.name == CONFIGS_DIR else path.stem


def read_config_tree(path: Path, _extending: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The config's mapping merged over the configs it extends (`base:`), the base's `name` left out."""
    raw = _read_mapping(path)
    base = raw.pop(BASE_KEY, None)
    if base is None:
        return raw
    base_path = (path.parent / str(base)).resolve()
    if base_path in (*_extending, path.resolve()):
        raise ConfigError(f"{path}: `{BASE_KEY}: {base}` extends itself through {base_path}. Fix: break the loop")
    if not base_path.is_file():
        raise ConfigError(f"{path}: `{BASE_KEY}: {base}` is not a file ({base_path}). Fix: a path relative to {path}")
    inherited = read_config_tree(base_path, (*_extending, path.resolve()))
    inherited.pop("name", None)
    merged = _merged(inherited, raw)
    base_model, own_model = inherited.get("model", {}), raw.get("model", {})
    if "name" in own_model and own_model["name"] != base_model.get("name"):
        merged["model"] = own_model  # another model: nothing of the base's model section applies to it
    return merged


def _read_mapping(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found. Fix: pass an existing YAML file, e.g. configs/*/*.yaml")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err}). Fix: correct the syntax at the position shown") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections. Fix: see configs/*/*.yaml")
    return raw


def _merged(base: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """`own` over `base`: mappings merge key by key, any other value replaces."""
    out = dict(base)
    for key, value in own.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """`--set KEY=VALUE` pairs -> {dotted key: YAML-parsed value}, e.g. ["train.lr=3e-4"] -> {"train.lr": 0.0003}."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {pair!r}: expected KEY=VALUE. Fix: e.g. --set train.epochs=40")
        out[key] = yaml.safe_load(value)
    return out


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value
