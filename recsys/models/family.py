"""What a model family is: its model's base class, the inputs a family may read, and its spec (`ModelFamily`).

Each family declares its spec in its own module (`FAMILY = ModelFamily(...)` at the end of `recsys/models/sasrec.py`,
...): its config dataclass and model class, how a model is built from config fields and inputs, what it reads
(`reads`: a function of its config, so `sid_levels: 0` reads no semantic IDs), the trained models it is built on
(`upstream`: each role's name under `model.upstream`, one model directory or a list, and the input it feeds), how it
trains (`training`: a key of `recsys.training.recipes`) and, for a model made of other models, how a saved one is
reshaped. The registry (`recsys.models.registry`) collects the specs; the pipeline builds only the inputs a family
reads and runs only the steps those inputs need; everything else asks the model through protocols
(`recsys.inference`, `recsys.training.capabilities`). docs/model-families.md walks through adding one.

Dimension letters: V+1 items (0 = padding), C content dim, T semantic-ID levels.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from recsys.data.categories import CategoryTable
from recsys.data.times import HistoryTimes
from recsys.errors import ConfigError
from recsys.runtime.validation import config_from
from recsys.semantic_ids.codes import SemanticIds

DEFAULT_MAX_HISTORY = 50  # the most recent history items a sequential model reads, unless its family says otherwise


class ModelConfig(Protocol):
    """What every family's config dataclass has."""

    @property
    def num_items(self) -> int:
        """V, filled in from the data."""
        ...


ConfigT = TypeVar("ConfigT", bound=ModelConfig)


class Model(nn.Module, abc.ABC, Generic[ConfigT]):
    """The base class of every family's model: an `nn.Module` holding its frozen config dataclass (`config`, what a
    saved model is rebuilt from) that scores every item for a batch of histories (`recsys.inference.Scorer`).

    Capabilities beyond scoring are protocols the model meets by having their methods: item vectors
    (`recsys.inference.VectorScorer`), text queries (`QueryScorer`), tasks, domains, and for training an item table
    read row by row (`recsys.training.capabilities`).
    """

    def __init__(self, config: ConfigT) -> None:
        super().__init__()
        self.config: ConfigT = config

    @property
    @abc.abstractmethod
    def max_history(self) -> int:
        """The most recent history items `score` reads: what evaluation, recommendation and serving feed it."""

    @property
    def reads_timestamps(self) -> bool:
        """Whether `score` needs the history's and the request's times (time-aware models raise without them)."""
        return False

    @abc.abstractmethod
    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded item_idx [+ (B,) user_idx, 0 = unknown] [+ times] -> (B, V+1) scores, higher better."""


class Input(StrEnum):
    """What a family may read besides its config fields; the pipeline builds these, and runs the steps they need,
    only for a family that reads them."""

    SEMANTIC_IDS = "semantic_ids"  # the catalog's semantic IDs (the `build_semantic_ids` step: a `sid` section)
    CONTENT = "content"  # (V+1, C) the items' content embeddings and their encoder (the `embed_content` step)
    ITEM_TEXTS = "item_texts"  # the texts those embeddings embed (the `content.text_fields` of every item)
    QUERIES = "queries"  # text queries: training queries made and embedded with the content; search evaluation
    DOMAINS = "domains"  # every item's domain and the domain names (multi-domain data)
    NEW_ITEMS = "new_items"  # the items held out of training (the cold-start split)
    ITEM_COUNTS = "item_counts"  # how often each item occurs in the training sequences (0: never trained)
    TASKS = "tasks"  # the data's prediction tasks beside the next item (`recsys.data.tasks`)
    CATEGORIES = "categories"  # every item's category-level ids (`recsys.data.categories`; data.attributes)
    # trained models this one is built on (model directories: the family's `UpstreamRole`s name them)
    RETRIEVER = "retriever"  # a trained first stage
    HOLDOUT_RETRIEVER = "holdout_retriever"  # that first stage trained without the last items (its recipe's)
    EXTRA_RETRIEVERS = "extra_retrievers"  # further trained first stages (a ranker's model candidate sources)
    EXTRA_HOLDOUT_RETRIEVERS = "extra_holdout_retrievers"  # each of them trained without the last items
    BASE = "base"  # a trained model adapted by this one
    MEMBERS = "members"  # trained models combined by this one


CONTENT_INPUTS = frozenset({Input.CONTENT, Input.ITEM_TEXTS, Input.QUERIES})  # made by the `embed_content` step


@dataclass(frozen=True)
class Upstream:
    """A trained model another is built on, with the name of its family (how it is saved and rebuilt)."""

    family: str
    model: Model[Any]

    def saved(self) -> dict[str, Any]:
        """{"name", "config"}: how a model made of others records this part, to rebuild its shape on loading."""
        return {"name": self.family, "config": dataclasses.asdict(self.model.config)}


@dataclass(frozen=True)
class ModelInputs:
    """What a model is built on besides its config fields: only what its family reads is given, the rest stays at
    its default.

    Args:
        semantic_ids: the catalog's semantic IDs (`Input.SEMANTIC_IDS`).
        content: (V+1, C) the items' content embeddings, row 0 (the padding) zero (`Input.CONTENT`).
        content_encoder: the encoder that made `content` (`ContentConfig.model`).
        item_texts: (V,) the texts `content` embeds, of items 1..V (`Input.ITEM_TEXTS`).
        item_domains: (V+1,) every item's domain index, -1 for the padding (`Input.DOMAINS`).
        domains: the domain names those indices stand for.
        new_items: (V+1,) bool, the items held out of training (`Input.NEW_ITEMS`).
        item_counts: (V+1,) each item's count in the training sequences, 0 for the padding and cold items
            (`Input.ITEM_COUNTS`).
        tasks: the tasks beside the next item whose labels the data has (`Input.TASKS`).
        categories: every item's category-level ids, None where the data has no category paths
            (`Input.CATEGORIES`).
        retriever: the trained first stage (`Input.RETRIEVER`).
        extra_retrievers: further trained first stages (`Input.EXTRA_RETRIEVERS`).
        base: the trained model this one adapts (`Input.BASE`).
        members: the trained models this one combines (`Input.MEMBERS`).
    """

    semantic_ids: SemanticIds | None = None
    content: torch.Tensor | None = None
    content_encoder: str | None = None
    item_texts: tuple[str, ...] | None = None
    item_domains: torch.Tensor | None = None
    domains: tuple[str, ...] = ()
    new_items: torch.Tensor | None = None
    item_counts: torch.Tensor | None = None
    tasks: tuple[str, ...] = ()
    categories: CategoryTable | None = None
    retriever: Upstream | None = None
    extra_retrievers: tuple[Upstream, ...] = ()
    base: Upstream | None = None
    members: tuple[Upstream, ...] = ()


UPSTREAM_KEY = "model.upstream"  # the experiment config's mapping of a family's upstream roles to model directories


@dataclass(frozen=True)
class UpstreamRole:
    """A trained model (or a list of them) that a family is built on: an experiment config names its model
    directory under `model.upstream.<name>`.

    Args:
        name: the role's key under `model.upstream` (and its entry in the train step's fingerprint).
        feeds: the input it is (`Input.RETRIEVER`, ...): what the model or its recipe gets.
        what: what it is, for messages, e.g. "the first stage whose top candidates it re-scores".
        many: a list of model directories rather than one.
        required: a config of the family must name it.
    """

    name: str
    feeds: Input
    what: str
    many: bool = False
    required: bool = True

    @property
    def key(self) -> str:
        """Its dotted config key."""
        return f"{UPSTREAM_KEY}.{self.name}"

    def check(self, family: str, given: object) -> None:
        """ConfigError naming the key and the fix when `given` (the config's value, None: absent) does not fit."""
        shape = "a list of trained model directories" if self.many else "a trained model directory"
        example = "[runs/models/A, runs/models/B]" if self.many else "runs/models/NAME"
        if given is None or given == []:
            if self.required:
                raise ConfigError(
                    f"{self.key}: model {family!r} is built on {self.what}, and the config names none. Fix: set "
                    f"{self.key} to {shape} (e.g. {example}; `--set {self.key}=...`)"
                )
            return
        paths = given if isinstance(given, list) else [given]
        if isinstance(given, list) != self.many or not all(isinstance(path, str | Path) for path in paths):
            raise ConfigError(f"{self.key}: {given!r} is not {shape}. Fix: e.g. {self.key}: {example}")


ModelT = TypeVar("ModelT", bound=Model[Any])
Rebuild = Callable[[Mapping[str, Any]], Model[Any]]  # a saved {"name", "config"} -> an untrained model of its shape


def reads_nothing(config: Any) -> frozenset[Input]:
    return frozenset()


@dataclass(frozen=True)
class ModelFamily(Generic[ConfigT, ModelT]):
    """A model family's spec: everything the rest of the platform asks about it.

    Args:
        name: its registry name (`model.name` in an experiment config).
        config: its config dataclass (`model.params`, with `num_items` and what `build` fills in).
        model: its model class.
        build: (config fields, `num_items` included; what it reads) -> a new, untrained model. It validates the
            fields (`validate`) after filling in what it derives from its inputs (e.g. the content's dim).
        training: how it trains, a key of `recsys.training.recipes` (its `model.training` settings and its recipe):
            "next_item", "queries", "generative", "two_tower", "ranker"; "counts" (fitted on item counts) and
            "frozen" (made of trained models) have no epoch loop.
        reads: its config -> the inputs it reads (`Input`) besides its upstream models; the pipeline builds those and
            no others.
        upstream: the trained models it is built on, by role (`UpstreamRole`); none for a model trained from data.
        shape: (a saved config, a rebuilder of saved parts) -> an untrained model of its shape, which the saved
            state dict then fills; None: `model(config)`.
        filled: the config fields `build` fills in (not the user's to set), with values that stand in for them when
            the user's params are checked before the data is read.
    """

    name: str
    config: type[ConfigT]
    model: type[ModelT]
    build: Callable[[dict[str, Any], ModelInputs], ModelT]
    training: str
    reads: Callable[[ConfigT], frozenset[Input]] = reads_nothing
    upstream: tuple[UpstreamRole, ...] = ()
    shape: Callable[[ConfigT, Rebuild], ModelT] | None = None
    filled: Mapping[str, Any] = field(default_factory=lambda: {"num_items": 1})

    def validate(self, fields: Mapping[str, Any], filled: Mapping[str, Any] | None = None) -> ConfigT:
        """The config of `fields` (`model.params` + what is filled in); ConfigError naming each bad key."""
        try:
            return config_from(self.config, fields, "model.params.", filled)
        except ConfigError as err:
            raise ConfigError(f"model {self.name!r}: {err}. Fix: correct model.params (docs/models.md)") from err

    def check_params(self, params: Mapping[str, Any]) -> ConfigT:
        """The user's `params` checked before the data is read: what the build fills in stands in for itself."""
        return self.validate(params, self.filled)

    def inputs(self, params: Mapping[str, Any]) -> frozenset[Input]:
        """What a model of these `params` reads, its upstream models included."""
        return self.reads(self.check_params(params)) | {role.feeds for role in self.upstream}

    def check_upstream(self, given: Mapping[str, object]) -> None:
        """The trained models a config names by role (`model.upstream`): ConfigError naming the key and the fix for
        a role the family has not, a required one missing or one of the wrong shape."""
        roles = {role.name: role for role in self.upstream}
        unknown = [f"{UPSTREAM_KEY}.{name}" for name in given if name not in roles]
        if unknown:
            known = ", ".join(role.key for role in self.upstream) or "none"
            raise ConfigError(
                f"{', '.join(unknown)}: model {self.name!r} is built on no such trained model (its roles: {known}). "
                "Fix: remove the key, or name a model family that reads it (docs/model-families.md)"
            )
        for role in self.upstream:
            role.check(self.name, given.get(role.name))

    def role(self, feeds: Input) -> UpstreamRole | None:
        """The upstream role that feeds input `feeds`, if the family has one."""
        return next((role for role in self.upstream if role.feeds == feeds), None)

    def reshaped(self, saved_config: Mapping[str, Any], rebuild: Rebuild) -> ModelT:
        """An untrained model of a saved config, for its state dict to fill."""
        config = self.validate(saved_config)
        return self.shape(config, rebuild) if self.shape is not None else self.model(config)


# ------------------------------------------------------------------------------------- what builders check


def required(value: Any, missing: str) -> Any:
    """`value`, or a ConfigError saying what is `missing` (and how to give it)."""
    if value is None:
        raise ConfigError(missing)
    return value


def check_items(upstream: Upstream, num_items: int, where: str) -> None:
    """An upstream model must be of the data's catalogue."""
    trained_on = upstream.model.config.num_items
    if trained_on != num_items:
        raise ConfigError(
            f"{where}: that {upstream.family} model was trained on {trained_on} items, the data has {num_items}. "
            "Fix: train it on the same prepared data"
        )


def semantic_ids_of(inputs: ModelInputs, name: str, num_items: int) -> SemanticIds:
    """The catalog's semantic IDs, of `num_items` items, for model `name`."""
    sids: SemanticIds = required(
        inputs.semantic_ids, f"model {name!r} needs semantic IDs. Fix: add a `sid` section to the experiment config"
    )
    if sids.num_items != num_items:
        raise ConfigError(
            f"the semantic IDs cover {sids.num_items} items but the data has {num_items}. Fix: build them from the "
            "same prepared data directory"
        )
    return sids


def semantic_id_codes(inputs: ModelInputs, name: str, num_items: int, levels: int) -> torch.Tensor | None:
    """(V+1, T) the semantic-ID codes for a model that reads `levels` > 0 of their levels; None for 0."""
    if not levels:
        return None
    codes = semantic_ids_of(inputs, name, num_items).codes
    if codes.shape[1] < levels:
        raise ConfigError(f"model.params.sid_levels={levels} but the semantic IDs have {codes.shape[1]} levels")
    return codes


def item_counts_of(inputs: ModelInputs, name: str, num_items: int) -> torch.Tensor:
    """(V+1,) the items' training counts, for model `name`."""
    counts: torch.Tensor = required(
        inputs.item_counts,
        f"model {name!r} reads the items' training counts and none were given. Fix: build it through the pipeline "
        "(`recsys train`), or pass ModelInputs.item_counts (`SequenceData.item_counts()`)",
    )
    if counts.shape != (num_items + 1,):
        raise ConfigError(
            f"item counts of shape {tuple(counts.shape)} for {num_items} items: one per item and the padding"
        )
    return counts


def content_of(inputs: ModelInputs, num_items: int) -> torch.Tensor:
    """(V+1, C) the items' content embeddings."""
    content: torch.Tensor = required(
        inputs.content,
        "the model reads content embeddings and none were built. Fix: run it through the pipeline "
        "(`recsys train` / `recsys pipeline run`), whose embed_content step embeds the `content` section's text",
    )
    if content.shape[0] != num_items + 1:
        raise ConfigError(f"the content embeddings have {content.shape[0] - 1} items, the data {num_items}")
    return content
