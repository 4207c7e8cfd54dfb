"""Model registry: every model by name, built from its config fields and what it is built on; saved and loaded as
one file.

What a model is built on reaches `build_model` typed (`ModelInputs`): the catalog's semantic IDs, content
embeddings, domains and new items, and trained models (a ranker's first stage, a domain-adapted retriever's base,
a fusion's members). A model file holds {"format", "name", "config" (the config dataclass's fields), "state_dict"}
and is written atomically; it carries everything the model was built on, so loading needs the file alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from recsys.errors import ConfigError, RecsysError
from recsys.models import TrainingFamily
from recsys.models.domain_adapters import DomainAdaptedRetriever, DomainAdapterConfig
from recsys.models.fusion import Fusion, FusionConfig
from recsys.models.generative import GenerativeConfig, GenerativeRetriever
from recsys.models.hstu import HSTU, HSTUConfig
from recsys.models.popularity import Popularity, PopularityConfig
from recsys.models.query_aware import QueryAwareConfig, QueryAwareRetriever
from recsys.models.ranker import RankerConfig, TwoStageRanker
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.models.two_tower import TwoTower, TwoTowerConfig
from recsys.runtime.checkpoint import load_checkpoint, save_checkpoint
from recsys.runtime.validation import config_from
from recsys.semantic_ids.codes import SemanticIds

Model = (
    Popularity
    | SASRec
    | HSTU
    | QueryAwareRetriever
    | GenerativeRetriever
    | TwoStageRanker
    | Fusion
    | TwoTower
    | DomainAdaptedRetriever
)
FORMAT = 2  # files of an earlier format hold configs of an earlier version of the models


@dataclass(frozen=True)
class ModelInputs:
    """What a model is built on besides its config fields; what a model does not read stays at its default.

    Args:
        semantic_ids: the catalog's semantic IDs (the generative model; SASRec and two-tower with `sid_levels`).
        content: (V+1, C) the items' content embeddings, row 0 (the padding) zero (two-tower and ranker with
            `use_content`; the query-aware model).
        content_encoder: the encoder that made `content` (`ContentConfig.model`): the query-aware model embeds its
            queries with it.
        item_texts: (V,) the texts `content` embeds, of items 1..V (the query-aware model's lexical tower).
        item_domains: (V+1,) every item's domain index, -1 for the padding (domain adapters).
        domains: the domain names those indices stand for (`SequenceData.domains`).
        new_items: (V+1,) bool, the items the generative model serves through `new_item_slots` (cold-start items).
        tasks: the prediction tasks beside the next item whose labels the data has (`recsys.data.tasks`; the ranker
            predicts them).
        retriever: the ranker's first stage, trained.
        base: the domain adapters' multi-domain SASRec, trained.
        members: the fusion's retrievers, trained.
    """

    semantic_ids: SemanticIds | None = None
    content: torch.Tensor | None = None
    content_encoder: str | None = None
    item_texts: tuple[str, ...] | None = None
    item_domains: torch.Tensor | None = None
    domains: tuple[str, ...] = ()
    new_items: torch.Tensor | None = None
    tasks: tuple[str, ...] = ()
    retriever: Model | None = None
    base: Model | None = None
    members: tuple[Model, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    config: type
    model: type[Model]
    build: Callable[[dict[str, Any], ModelInputs], Model]  # config fields (num_items included), inputs -> a new model
    shape: Callable[[Any], Model] | None = None  # a saved config -> a model of its shape; None = `model(config)`
    # the config fields `build` fills in from the data and the inputs (not the user's to set), with values that
    # stand in for them when the user's params are checked before the data is read (`check_params`)
    filled: Mapping[str, Any] = field(default_factory=lambda: {"num_items": 1})

    @property
    def training_family(self) -> TrainingFamily:
        return self.model.training_family


def build_model(name: str, params: Mapping[str, Any], num_items: int, inputs: ModelInputs | None = None) -> Model:
    """Instantiate model `name` with `params` (validated against its config dataclass) for V items on `inputs`."""
    return model_spec(name).build({**params, "num_items": num_items}, inputs or ModelInputs())


def check_params(name: str, params: Mapping[str, Any]) -> None:
    """Validate model `name`'s `params` before the data is read: what the build fills in stands in for itself."""
    _validate(name, params, model_spec(name).filled)


def model_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}. Fix: use one of {', '.join(sorted(MODELS))}")
    return MODELS[name]


def save_model(path: Path, name: str, model: Model) -> None:
    config = dataclasses.asdict(model.config)
    save_checkpoint(path, {"format": FORMAT, "name": name, "config": config, "state_dict": model.state_dict()})


def load_model(path: Path) -> tuple[str, Model]:
    """Rebuild a saved model (on the CPU, in eval mode); returns (name, model)."""
    if not path.is_file():
        raise RecsysError(f"{path}: model file not found. Fix: train one with `recsys train --config ...`")
    payload = load_checkpoint(path)
    if payload.get("format") != FORMAT:
        raise RecsysError(
            f"{path} was written by an earlier version of recsys (model file format {payload.get('format', 1)}, "
            f"this version reads {FORMAT}). Fix: train the model again"
        )
    name, model = payload["name"], _shaped({"name": payload["name"], "config": payload["config"]})
    model.load_state_dict(payload["state_dict"])
    return name, model.eval()


def spec_of(model: Model) -> dict[str, Any]:
    """{"name", "config"}: how a composite model records a part, to rebuild its shape on loading."""
    return {"name": _name_of(model), "config": dataclasses.asdict(model.config)}


def _shaped(spec: Mapping[str, Any]) -> Model:
    """An untrained model of a saved {"name", "config"}; its state dict (and its parts') fills it."""
    model = model_spec(spec["name"])
    config = _validate(spec["name"], spec["config"])
    return model.shape(config) if model.shape is not None else model.model(config)  # type: ignore[call-arg]


def _validate(name: str, fields: Mapping[str, Any], filled: Mapping[str, Any] | None = None) -> Any:
    try:
        return config_from(model_spec(name).config, fields, "model.params.", filled)
    except ConfigError as err:
        raise ConfigError(f"model {name!r}: {err}. Fix: correct model.params (docs/models.md)") from err


# ----------------------------------------------------------------------------------------------- the builders


def _sasrec(fields: dict[str, Any], inputs: ModelInputs) -> SASRec:
    config: SASRecConfig = _validate("sasrec", fields)
    return SASRec(config, _codes(inputs, "sasrec", config.num_items, config.sid_levels))


def _hstu(fields: dict[str, Any], inputs: ModelInputs) -> HSTU:
    return HSTU(_validate("hstu", fields))


def _popularity(fields: dict[str, Any], inputs: ModelInputs) -> Popularity:
    return Popularity(_validate("popularity", fields))


def _generative(fields: dict[str, Any], inputs: ModelInputs) -> GenerativeRetriever:
    sids = _semantic_ids(inputs, "generative", fields["num_items"])
    config: GenerativeConfig = _validate("generative", {**fields, "codebook_sizes": sids.codebook_sizes})
    model = GenerativeRetriever(config, sids.codes)
    if inputs.new_items is not None:
        model.mark_new_items(inputs.new_items)
    return model


def _two_tower(fields: dict[str, Any], inputs: ModelInputs) -> TwoTower:
    config: TwoTowerConfig = _validate("two_tower", fields)
    codes = _codes(inputs, "two_tower", config.num_items, config.sid_levels)
    if not config.use_content:
        return TwoTower(config, codes)
    content = _content(inputs, config.num_items)
    return TwoTower(dataclasses.replace(config, content_dim=content.shape[1]), codes, content)


def _query_aware(fields: dict[str, Any], inputs: ModelInputs) -> QueryAwareRetriever:
    content = _content(inputs, fields["num_items"])
    encoder = _required(inputs.content_encoder, "model 'query_aware' embeds queries with the items' content encoder. "
                        "Fix: add a `sid` section whose `content` names it")  # fmt: skip
    config: QueryAwareConfig = _validate("query_aware", {**fields, "content_dim": content.shape[1], "encoder": encoder})
    if not config.lexical:
        return QueryAwareRetriever(config, content)
    texts = _required(inputs.item_texts, "model 'query_aware' with its lexical tower (model.params.lexical) indexes "
                      "the items' texts. Fix: add a `sid` section whose `content` names the text fields")  # fmt: skip
    if len(texts) != config.num_items:
        raise ConfigError(f"{len(texts)} item texts for {config.num_items} items. Fix: one text per item, by index")
    return QueryAwareRetriever(config, content, texts)


def _ranker(fields: dict[str, Any], inputs: ModelInputs) -> TwoStageRanker:
    """A ranker over its trained first stage, frozen; it starts from the first stage's item vectors where those are
    the retriever's item table (input and output tied) of the ranker's dim."""
    retriever = _required(inputs.retriever, "model 'ranker' re-scores a first stage. Fix: set model.retriever_dir")
    _check_items(retriever, fields["num_items"], "model.retriever_dir")
    config: RankerConfig = _validate("ranker", {**fields, "retriever": spec_of(retriever)})
    tied = getattr(retriever, "ties_item_embeddings", False)
    items = retriever.item_embeddings() if tied else None
    items = items if items is not None and items.shape[1] == config.dim else None
    if config.freeze_item_embeddings and items is None:
        raise ConfigError(
            f"model.params.freeze_item_embeddings keeps the item vectors of a first stage whose input and output item "
            f"vectors are one table of the ranker's dim ({config.dim}), e.g. a SASRec; this one is a "
            f"{_name_of(retriever)} model of another kind or size. Fix: set it to false"
        )
    content = _content(inputs, config.num_items) if config.use_content else None
    if content is not None:
        config = dataclasses.replace(config, content_dim=content.shape[1])
    config = dataclasses.replace(config, tasks=_tasks(config.tasks, inputs.tasks))
    model = TwoStageRanker(config, retriever, content)
    if items is not None:
        with torch.no_grad():  # start from the retriever's item vectors: the ranker refines, not relearns
            model.ranker.item_emb.weight.copy_(items)
    return model


def _domain_adapted(fields: dict[str, Any], inputs: ModelInputs) -> DomainAdaptedRetriever:
    base = _required(inputs.base, "model 'domain_adapters' adapts a SASRec of every domain. Fix: set model.base_dir")
    if not isinstance(base, SASRec):  # its adapters wrap SASRec's block layers by name
        raise ConfigError(f"model 'domain_adapters' adapts a SASRec; model.base_dir holds a {_name_of(base)} model")
    _check_items(base, fields["num_items"], "model.base_dir")
    item_domains = _required(inputs.item_domains, "model 'domain_adapters' needs the items' domains (a domain column)")
    asked = tuple(fields.get("domains") or inputs.domains)
    if asked != inputs.domains:
        raise ConfigError(
            f"model.params.domains={list(asked)} but the data's domains are {list(inputs.domains)}. Fix: leave "
            "domains out (the data's are used)"
        )
    params = {k: v for k, v in fields.items() if k != "num_items"}  # the model fills in its base's size
    return DomainAdaptedRetriever(_validate("domain_adapters", {**params, "domains": asked}), base, item_domains)


def _fusion(fields: dict[str, Any], inputs: ModelInputs) -> Fusion:
    if len(inputs.members) < 2:
        raise ConfigError("model 'fusion' needs model.members: a list of >= 2 trained model directories")
    for member in inputs.members:
        _check_items(member, fields["num_items"], "model.members")
    specs = [spec_of(member) for member in inputs.members]
    return Fusion(_validate("fusion", {**fields, "members": specs}), list(inputs.members))


# ------------------------------------------------------------------------------------- shapes of saved models


def _ranker_shape(config: RankerConfig) -> TwoStageRanker:
    return TwoStageRanker(config, _shaped(config.retriever))


def _domain_adapted_shape(config: DomainAdapterConfig) -> DomainAdaptedRetriever:
    base = _shaped(config.base)
    assert isinstance(base, SASRec)
    return DomainAdaptedRetriever(config, base, torch.zeros(config.num_items + 1, dtype=torch.long))


def _generative_shape(config: GenerativeConfig) -> GenerativeRetriever:
    codes = torch.zeros(config.num_items + 1, len(config.codebook_sizes), dtype=torch.long)  # the state dict's
    return GenerativeRetriever(config, codes)


MODELS: dict[str, ModelSpec] = {
    "popularity": ModelSpec(PopularityConfig, Popularity, _popularity),
    "sasrec": ModelSpec(SASRecConfig, SASRec, _sasrec),  # its semantic-ID index comes with the state dict
    "hstu": ModelSpec(HSTUConfig, HSTU, _hstu),
    "query_aware": ModelSpec(
        QueryAwareConfig, QueryAwareRetriever, _query_aware, filled={"num_items": 1, "content_dim": 1, "encoder": ""}
    ),
    "two_tower": ModelSpec(TwoTowerConfig, TwoTower, _two_tower, filled={"num_items": 1, "content_dim": 0}),
    "generative": ModelSpec(
        GenerativeConfig,
        GenerativeRetriever,
        _generative,
        _generative_shape,
        filled={"num_items": 1, "codebook_sizes": (1,)},
    ),
    "ranker": ModelSpec(
        RankerConfig, TwoStageRanker, _ranker, _ranker_shape, filled={"num_items": 1, "retriever": {}, "content_dim": 0}
    ),
    "domain_adapters": ModelSpec(
        DomainAdapterConfig,
        DomainAdaptedRetriever,
        _domain_adapted,
        _domain_adapted_shape,
        filled={"num_items": 0, "base": {}},
    ),
    "fusion": ModelSpec(
        FusionConfig,
        Fusion,
        _fusion,
        lambda config: Fusion(config, [_shaped(m) for m in config.members]),
        filled={"num_items": 1, "members": []},
    ),
}


# ------------------------------------------------------------------------------------------ the inputs' checks


def _name_of(model: Model) -> str:
    """The registry name of a model's class."""
    return next(name for name, spec in MODELS.items() if type(model) is spec.model)


def _required(value: Any, missing: str) -> Any:
    if value is None:
        raise ConfigError(missing)
    return value


def _check_items(model: Model, num_items: int, where: str) -> None:
    if model.config.num_items != num_items:
        raise ConfigError(
            f"{where}: that {_name_of(model)} model was trained on {model.config.num_items} items, the data has "
            f"{num_items}. Fix: train it on the same prepared data"
        )


def _semantic_ids(inputs: ModelInputs, name: str, num_items: int) -> SemanticIds:
    sids = _required(
        inputs.semantic_ids, f"model {name!r} needs semantic IDs. Fix: add a `sid` section to the experiment config"
    )
    if sids.num_items != num_items:
        raise ConfigError(
            f"the semantic IDs cover {sids.num_items} items but the data has {num_items}. Fix: build them from the "
            "same prepared data directory"
        )
    return sids


def _codes(inputs: ModelInputs, name: str, num_items: int, levels: int) -> torch.Tensor | None:
    """(V+1, T) the semantic-ID codes for a model that reads `levels` > 0 of their levels; None for 0."""
    if not levels:
        return None
    codes = _semantic_ids(inputs, name, num_items).codes
    if codes.shape[1] < levels:
        raise ConfigError(f"model.params.sid_levels={levels} but the semantic IDs have {codes.shape[1]} levels")
    return codes


def _tasks(asked: tuple[str, ...] | None, available: tuple[str, ...]) -> tuple[str, ...]:
    """The ranker's tasks: those asked for (all the data has when None), each one the data has labels for."""
    if asked is None:
        return available
    missing = [task for task in asked if task not in available]
    if missing:
        raise ConfigError(
            f"model.params.tasks {list(asked)}: the data has no labels for {missing}. Fix: choose among "
            f"{list(available)} (recsys.data.tasks), or leave tasks out for all of them"
        )
    return tuple(asked)


def _content(inputs: ModelInputs, num_items: int) -> torch.Tensor:
    content = _required(
        inputs.content,
        "model.params.use_content needs content embeddings. Fix: add a `sid` section (its `content` settings embed "
        "the item text) to the experiment config",
    )
    if content.shape[0] != num_items + 1:
        raise ConfigError(f"the content embeddings have {content.shape[0] - 1} items, the data {num_items}")
    return content
