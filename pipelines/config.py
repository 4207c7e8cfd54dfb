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

import dataclasses
import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from features.attributes import AttributeFiles
from features.settings import PrepareSettings
from pipelines.tracking import TrackingSection
from recsys.enrich.columns import COLUMNS as METADATA_COLUMNS
from recsys.enrich.columns import metadata_fields, unknown_metadata_fields
from recsys.enrich.config import EnrichConfig
from recsys.errors import ConfigError
from recsys.evaluation import EvalConfig
from recsys.models.family import UPSTREAM_KEY, Input
from recsys.models.registry import model_family
from recsys.retrieval import IndexConfig
from recsys.runtime.names import check_name
from recsys.runtime.validation import as_json, config_from, problems
from recsys.runtime.yaml_files import load_yaml, read_yaml
from recsys.semantic_ids.collaborative import CollaborativeVectors
from recsys.semantic_ids.content import ContentConfig
from recsys.semantic_ids.rqkmeans import RQKMeansConfig
from recsys.semantic_ids.rqvae import RQVAEConfig
from recsys.training.config import TrainConfig
from recsys.training.recipes import DistillConfig, QueryTraining, training_named

logger = logging.getLogger(__name__)

BASE_KEY = "base"
CONFIGS_DIR = "configs"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataSection(PrepareSettings):
    """Where the interactions come from, and how they are prepared (`features.settings.PrepareSettings`, as
    `recsys data prepare` takes them)."""

    source: str = "synthetic"
    path: Path | None = None  # raw input (file or directory); None for the synthetic source
    options: dict[str, Any] = Field(default_factory=dict)  # loader options, e.g. num_users for synthetic
    # multi-domain data: train and evaluate on this domain's users and items only (the catalog's indices stay)
    domain: str | None = None
    # optional item attribute files (`features.attributes`), e.g. {categories: item_categories.csv}; a relative path
    # is taken in the input directory (`path`, or the directory of the file it names)
    attributes: AttributeFiles = Field(default_factory=AttributeFiles)

    def prepare_settings(self) -> PrepareSettings:
        return PrepareSettings(**{key: getattr(self, key) for key in PrepareSettings.model_fields})

    def attribute_files(self) -> AttributeFiles:
        """`attributes` with relative paths taken in the input directory."""
        base = None if self.path is None else self.path if self.path.is_dir() else self.path.parent
        return self.attributes.resolved(base)


class ModelSection(Section):
    """The model: its family's name (`recsys.models.registry`), its config fields (num_items comes from the data),
    its family's training settings (`recsys.training.recipes`), and the trained models it is built on, by the roles
    its family declares (`recsys.models.family.UpstreamRole`), e.g. `upstream: {retriever: DIR}` for the ranker."""

    name: str = "sasrec"
    params: dict[str, Any] = Field(default_factory=dict)
    training: dict[str, Any] = Field(default_factory=dict)
    # role -> its model directory, or a list of them (each family's roles check the shape: `check_upstream`)
    upstream: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_model_params_and_training(self) -> ModelSection:
        """Fail at load time, naming the key, rather than after the data is prepared or when training starts."""
        try:
            family = model_family(self.name)
        except ConfigError as err:
            raise ConfigError(f"model.name: {err}") from err
        family.check_params(self.params)
        self.training_settings()
        family.check_upstream(self.upstream)
        return self

    def reads(self) -> frozenset[Input]:
        """What the model reads (`recsys.models.family.Input`): the pipeline builds these inputs and no others."""
        return model_family(self.name).inputs(self.params)

    def training_settings(self) -> object:
        """`training`, validated against the settings of the model family's training."""
        training = training_named(model_family(self.name).training)
        try:
            return config_from(training.settings, self.training, "model.training.")
        except ConfigError as err:
            raise ConfigError(f"{err}. Fix: use the {self.name} model's training settings (docs/training.md)") from err

    def training_record(self) -> dict[str, Any]:
        """The training settings in full, defaults included: what MLflow and a benchmark result record of them."""
        settings = self.training_settings()
        assert dataclasses.is_dataclass(settings) and not isinstance(settings, type)  # every training's settings are
        record: dict[str, Any] = TypeAdapter(type(settings)).dump_python(settings, mode="json")  # as the JSON holds it
        return record

    def upstream_dirs(self) -> dict[str, Path]:
        """Every model directory this model is built on (what its fingerprint depends on), by entry: its role, with
        `[i]` for the i-th of a list (`members[0]`); `upstream_key` gives the config key naming it."""
        return {entry: path for role in self.upstream for entry, path in self._entries(role)}

    def upstream_key(self, entry: str) -> str:
        """The dotted config key naming the model directory of an entry of `upstream_dirs`."""
        return f"{UPSTREAM_KEY}.{entry}"

    def upstream_of(self, feeds: Input) -> list[tuple[str, Path]]:
        """(config key, model directory) of each trained model the config names for the role that feeds `feeds`."""
        role = model_family(self.name).role(feeds)
        return [] if role is None else [(self.upstream_key(e), path) for e, path in self._entries(role.name)]

    def _entries(self, role: str) -> list[tuple[str, Path]]:
        given = self.upstream.get(role)
        if isinstance(given, list):
            return [(f"{role}[{i}]", Path(path)) for i, path in enumerate(given)]
        return [] if given is None else [(role, Path(given))]


class SidSection(Section):
    """How semantic IDs are built (section `sid`)."""

    method: Literal["rqvae", "rqkmeans"] = "rqvae"
    # "content": LLM embeddings of the item text; "random": Gaussian vectors of the same size (the ablation
    # that shows what the content is worth); "collaborative": what the training interactions say (no text needed:
    # recsys.semantic_ids.collaborative); "content_and_collaborative": both, L2-normalised and side by side
    vectors: Literal["content", "random", "collaborative", "content_and_collaborative"] = "content"
    collaborative: CollaborativeVectors = Field(default_factory=CollaborativeVectors)
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
    # an evaluation directory (WORK/evaluations/NAME) of the run this one is measured against, e.g. its twin without
    # an LLM consumer: the evaluate step adds the paired difference on the same test users to its report
    compare_with: Path | None = None


class ExperimentConfig(Section):
    name: str
    data: DataSection = DataSection()
    model: ModelSection = ModelSection()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    # how the items' text is embedded, for the models that read content (and for semantic IDs)
    content: ContentConfig = ContentConfig()
    # LLM-written item metadata (the enrich_items step), read where a consumer names it (recsys.enrich.columns)
    enrich: EnrichConfig | None = None
    sid: SidSection | None = None  # semantic IDs to build before training (models that read them)
    tracking: TrackingSection = TrackingSection()
    pipeline: PipelineSection = PipelineSection()
    distill: DistillConfig | None = None  # train the model as a student of a teacher (docs/training.md)

    @field_validator("name")
    @classmethod
    def _one_directory_name(cls, name: str) -> str:
        """The name is a directory name under the work dir (WORK/data/NAME, WORK/models/NAME, ...): one path part."""
        return check_name(name, "name")

    @model_validator(mode="after")
    def _semantic_ids_are_built(self) -> ExperimentConfig:
        if Input.SEMANTIC_IDS in self.model.reads() and self.sid is None:
            raise ConfigError(
                f"model {self.model.name!r} with these params reads semantic IDs, which a `sid` section builds. "
                "Fix: add one (e.g. configs/beauty/sasrec-sid.yaml's), or set the params that read them to 0"
            )
        return self

    @model_validator(mode="after")
    def _metadata_is_made(self) -> ExperimentConfig:
        """A consumer of the LLM's item metadata needs the enrich step that writes it, and its real column names."""
        unknown = unknown_metadata_fields(self.content.text_fields)
        if unknown:
            raise ConfigError(
                f"content.text_fields names {unknown}, which are not item metadata columns. Fix: use some of "
                f"{', '.join(METADATA_COLUMNS)}"
            )
        readers = []
        if named := metadata_fields(self.content.text_fields):
            readers.append(f"content.text_fields ({', '.join(named)})")
        training = self.model.training_settings()
        if isinstance(training, QueryTraining) and training.llm_queries:
            readers.append("model.training.llm_queries")
        if readers and self.enrich is None:
            raise ConfigError(
                f"{' and '.join(readers)} read LLM-written item metadata, and the config has no `enrich` section to "
                "write it. Fix: add one (`enrich: {backend: local}` asks the packaged Gemma model; `records: PATH` "
                "reads records written elsewhere; docs/enrich.md), or remove them"
            )
        return self

    @model_validator(mode="after")
    def _distils_a_next_item_model(self) -> ExperimentConfig:
        """A student is a next-item model trained on the whole data in memory (its teacher's cache covers it)."""
        if self.distill is None:
            return self
        if model_family(self.model.name).training != "next_item":
            raise ConfigError(
                f"distill: the student must be a next-item model (sasrec, hstu), not {self.model.name!r}. "
                "Fix: set model.name: sasrec (its serving size in model.params), or remove the distill section"
            )
        if self.train.stream_parts is not None:
            raise ConfigError(
                "distill: the teacher's cache covers the training rows in memory. Fix: remove train.stream_parts"
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
        overrides: dotted keys applied on top, e.g. {"train.schedule.epochs": 2, "data.path": "x"}.

    Values are taken as the types they are written in (`epochs: true` is not 1, `lr: "1e-3"` is not a number; an
    unquoted `lr: 1e-3` is: `recsys.runtime.yaml_files`).
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
        return ExperimentConfig.model_validate_json(as_json(raw), strict=True)
    except ValidationError as err:
        raise ConfigError(f"{path}: {problems(err)}. Fix: correct these keys (see configs/*/*.yaml)") from err
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err


def default_name(path: Path) -> str:
    """`<dataset>-<stem>` for <any folder named configs>/<dataset>/<stem>.yaml, else the stem.

    Example:
        >>> default_name(Path("configs/beauty/sasrec.yaml")), default_name(Path("lab/configs/beauty/tiger.yaml"))
        ('beauty-sasrec', 'beauty-tiger')
        >>> default_name(Path("lab/configs/retrieval-zoo.yaml"))
        'retrieval-zoo'
    """
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
    raw = read_yaml(path) or {}
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
    """`--set KEY=VALUE` pairs -> {dotted key: YAML-parsed value}.

    Example:
        >>> parse_overrides(["train.optimization.lr=3e-4", "model.params.dim=64"])
        {'train.optimization.lr': 0.0003, 'model.params.dim': 64}
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {pair!r}: expected KEY=VALUE. Fix: e.g. --set train.schedule.epochs=40")
        out[key] = load_yaml(value, f"--set {key}")
    return out


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set the dotted key `dotted` of `tree` to `value`, making the mappings on its way; ConfigError for an empty part
    of the key, or a part under a value that is not a mapping (`model.name.x` when `model.name` is a string).

    Example:
        >>> tree = {"model": {"name": "sasrec"}}
        >>> set_dotted(tree, "model.params.dim", 64); tree
        {'model': {'name': 'sasrec', 'params': {'dim': 64}}}
        >>> set_dotted(tree, "model.name.x", 1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        recsys.errors.ConfigError: model.name.x: model.name is 'sasrec', not a mapping, so it has no key 'x'. Fix: ...
    """
    *parents, leaf = parts = dotted.split(".")
    if not all(parts):
        raise ConfigError(f"{dotted!r}: a dotted key has an empty part. Fix: name each level, e.g. model.params.dim")
    for depth, key in enumerate(parents):
        tree = tree.setdefault(key, {})
        if not isinstance(tree, dict):
            above, below = ".".join(parts[: depth + 1]), parts[depth + 1]
            shown = repr(tree) if len(repr(tree)) <= 60 else f"a {type(tree).__name__}"
            raise ConfigError(
                f"{dotted}: {above} is {shown}, not a mapping, so it has no key {below!r}. Fix: set {above} itself, "
                "or a key of a section (e.g. model.params.dim)"
            )
    replaced = tree.get(leaf)
    if isinstance(value, dict) and isinstance(replaced, dict) and (dropped := sorted(replaced.keys() - value.keys())):
        logger.warning(
            "%s: the override replaces the whole mapping, so %s, set by the config, fall back to their defaults; to "
            "change some keys and keep the others, set each one (e.g. %s.%s)",
            dotted, ", ".join(dropped), dotted, next(iter(value), "<key>"),
        )  # fmt: skip
    tree[leaf] = value
