"""Model registry: build a model from its name and config fields; save and load model files.

A model file holds {"name", "config" (dataclass fields), "state_dict"} and is written atomically.
The generative model also takes `semantic_ids` (a semantic_ids.parquet path) in its params when built
for training; a saved one carries its codes in the state dict.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from pydantic import TypeAdapter, ValidationError

from recsys.errors import ConfigError, RecsysError
from recsys.models.domain_adapters import DomainAdaptedRetriever, DomainAdapterConfig
from recsys.models.fusion import Fusion, FusionConfig
from recsys.models.generative import GenerativeConfig, GenerativeRetriever
from recsys.models.hstu import HSTU, HSTUConfig
from recsys.models.popularity import Popularity, PopularityConfig
from recsys.models.ranker import RankerConfig, TwoStageRanker
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.models.two_tower import TwoTower, TwoTowerConfig
from recsys.runtime.checkpoint import load_checkpoint, save_checkpoint

Model = Popularity | SASRec | HSTU | GenerativeRetriever | TwoStageRanker | Fusion | TwoTower | DomainAdaptedRetriever

CONFIGS: dict[str, type] = {
    "popularity": PopularityConfig,
    "sasrec": SASRecConfig,
    "hstu": HSTUConfig,
    "generative": GenerativeConfig,
    "ranker": RankerConfig,
    "fusion": FusionConfig,
    "two_tower": TwoTowerConfig,
    "domain_adapters": DomainAdapterConfig,
}
# Models that score by a dot product of a user vector (`encode_queries`) and item vectors
# (`item_embeddings`): the ones a FAISS index of item vectors can serve.
VECTOR_MODELS = frozenset({"sasrec", "hstu", "two_tower"})


def build_model(name: str, params: dict[str, Any], num_items: int) -> Model:
    """Instantiate model `name` with `params` (validated against its config dataclass) for V items."""
    if name not in CONFIGS:
        raise ConfigError(f"unknown model {name!r}. Fix: use one of {', '.join(sorted(CONFIGS))}")
    params = dict(params)
    # paths the experiment passes when it has a `sid` section; models that do not read them ignore them
    sid_path = params.pop("semantic_ids", None)
    content_path = params.pop("content_embeddings", None)
    if name == "ranker":
        return _two_stage(params, num_items, content_path)
    if name == "fusion":
        return _fusion(params, num_items)
    if name == "domain_adapters":
        return _domain_adapted(params, num_items)
    codes = None
    if name == "generative" or (name in ("sasrec", "two_tower") and params.get("sid_levels")):
        codes, sizes = _semantic_ids(sid_path, name, num_items)
        if name == "generative":
            params["codebook_sizes"] = sizes
    config = _validate(name, {**params, "num_items": num_items})
    if isinstance(config, GenerativeConfig):
        return GenerativeRetriever(config, codes if codes is not None else _placeholder_codes(config))
    if isinstance(config, SASRecConfig):
        if codes is not None and codes.shape[1] < config.sid_levels:
            raise ConfigError(f"model.params.sid_levels={config.sid_levels} but {sid_path} has {codes.shape[1]} levels")
        return SASRec(config, codes)
    if isinstance(config, HSTUConfig):
        return HSTU(config)
    if isinstance(config, TwoTowerConfig):
        return _two_tower(config, codes, content_path)
    return Popularity(config)


def save_model(path: Path, name: str, model: Model) -> None:
    config = dataclasses.asdict(model.config)
    save_checkpoint(path, {"name": name, "config": config, "state_dict": model.state_dict()})


def load_model(path: Path) -> tuple[str, Model]:
    """Rebuild a saved model (on the CPU, in eval mode); returns (name, model)."""
    if not path.is_file():
        raise RecsysError(f"{path}: model file not found. Fix: train one with `recsys train --config ...`")
    payload = load_checkpoint(path)
    name = payload["name"]
    model = _unfilled(name, _validate(name, payload["config"]))
    model.load_state_dict(payload["state_dict"])
    return name, model.eval()


def _unfilled(name: str, config: Any) -> Model:
    """A model of `config`'s shape whose weights (and buffers) a saved state dict will fill."""
    if isinstance(config, RankerConfig):
        retriever = config.retriever
        first = _unfilled(retriever["name"], _validate(retriever["name"], retriever["config"]))
        return TwoStageRanker(config, first)
    if isinstance(config, GenerativeConfig):
        return GenerativeRetriever(config, _placeholder_codes(config))
    if isinstance(config, HSTUConfig):
        return HSTU(config)
    if isinstance(config, TwoTowerConfig):
        return TwoTower(config)
    if isinstance(config, DomainAdapterConfig):
        base = _unfilled(config.base["name"], _validate(config.base["name"], config.base["config"]))
        assert isinstance(base, SASRec)
        return DomainAdaptedRetriever(config, base, torch.zeros(config.num_items + 1, dtype=torch.long))
    if isinstance(config, FusionConfig):
        return Fusion(config, [_unfilled(m["name"], _validate(m["name"], m["config"])) for m in config.members])
    # SASRec's semantic-ID prefix index is a buffer: it comes with the state dict
    return Popularity(config) if isinstance(config, PopularityConfig) else SASRec(config)


def _two_stage(params: dict[str, Any], num_items: int, content_path: str | None) -> TwoStageRanker:
    """A ranker over the trained retriever of `params["retriever_dir"]` (a model directory), frozen; with
    `use_content`, it reads the content embeddings of `content_path`."""
    retriever_dir = params.pop("retriever_dir", None)  # the retriever carries its own semantic IDs
    if retriever_dir is None:
        raise ConfigError("model 'ranker' needs model.params.retriever_dir: the model directory of a trained retriever")
    name, retriever = load_trained_model(Path(retriever_dir), num_items)
    retriever_spec = {"name": name, "config": dataclasses.asdict(retriever.config)}
    config = _validate("ranker", {**params, "num_items": num_items, "retriever": retriever_spec})
    items = None  # the retriever's item vectors, where the ranker can start from them
    if isinstance(retriever, SASRec) and retriever.config.dim == config.dim:
        items = retriever.item_embeddings()
    if config.freeze_item_embeddings and items is None:
        raise ConfigError(
            f"model.params.freeze_item_embeddings keeps the item vectors of a SASRec retriever of the ranker's dim "
            f"({config.dim}); {retriever_dir} holds a {name} model of another kind or size. Fix: set it to false"
        )
    content = _content_rows(content_path, num_items) if config.use_content else None
    if content is not None:
        config = dataclasses.replace(config, content_dim=content.shape[1])
    model = TwoStageRanker(config, retriever, content)
    if items is not None:
        with torch.no_grad():  # start from the retriever's item vectors: the ranker refines, not relearns
            model.ranker.item_emb.weight.copy_(items)
    return model


def _domain_adapted(params: dict[str, Any], num_items: int) -> DomainAdaptedRetriever:
    """Per-domain adapters over the trained SASRec of `params["base_dir"]`; the items' domains come with the data
    (`DomainAdaptedRetriever.item_domain`, set before training)."""
    base_dir = params.pop("base_dir", None)
    if base_dir is None:
        raise ConfigError(
            "model 'domain_adapters' needs model.params.base_dir: the model directory of a SASRec trained on every "
            "domain of this data"
        )
    name, base = load_trained_model(Path(base_dir), num_items)
    if not isinstance(base, SASRec):
        raise ConfigError(f"model 'domain_adapters' adapts a SASRec; {base_dir} holds a {name} model")
    config = _validate("domain_adapters", params)  # the model fills in its base's spec and size
    return DomainAdaptedRetriever(config, base, torch.full((num_items + 1,), -1, dtype=torch.long))


def _two_tower(config: TwoTowerConfig, codes: torch.Tensor | None, content_path: str | None) -> TwoTower:
    """A two-tower model; with `use_content`, its item tower reads the content embeddings of `content_path`."""
    if not config.use_content:
        return TwoTower(config, codes)
    content = _content_rows(content_path, config.num_items)
    return TwoTower(dataclasses.replace(config, content_dim=content.shape[1]), codes, content)


def _content_rows(content_path: str | None, num_items: int) -> torch.Tensor:
    """(V+1, C) the content embeddings of `content_path`, row 0 (the padding item) zero."""
    from recsys.semantic_ids.content import read_content_embeddings

    if content_path is None:
        raise ConfigError(
            "model.params.use_content needs content embeddings. Fix: add a `sid` section (its `content` settings "
            "embed the item text) to the experiment config"
        )
    vectors = torch.from_numpy(read_content_embeddings(Path(content_path), num_items)).float()
    return torch.cat([torch.zeros(1, vectors.shape[1]), vectors])


def _fusion(params: dict[str, Any], num_items: int) -> Fusion:
    """Rank fusion of the trained retrievers in the model directories `params["members"]`."""
    member_dirs = params.pop("members", None)  # each member carries its own semantic IDs
    if not member_dirs or isinstance(member_dirs, str):
        raise ConfigError("model 'fusion' needs model.params.members: a list of >= 2 trained model directories")
    members = [load_trained_model(Path(d), num_items) for d in member_dirs]
    specs = [{"name": name, "config": dataclasses.asdict(model.config)} for name, model in members]
    max_len = max(getattr(m.config, "max_len", getattr(m.config, "max_history", 0)) for _, m in members)
    config = _validate("fusion", {**params, "num_items": num_items, "members": specs, "max_len": max_len})
    return Fusion(config, [model for _, model in members])


def load_trained_model(model_dir: Path, num_items: int) -> tuple[str, Model]:
    """A trained model of `model_dir`, checked against the catalog it will be combined on."""
    name, model = load_model(model_dir / "model.pt")
    if model.config.num_items != num_items:
        raise ConfigError(
            f"the model in {model_dir} was trained on {model.config.num_items} items, the data has "
            f"{num_items}. Fix: train it on the same prepared data"
        )
    return name, model


def _validate(name: str, fields: dict[str, Any]) -> Any:
    try:
        return TypeAdapter(CONFIGS[name]).validate_python(fields)
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"model {name!r}: {problems}. Fix: correct model.params") from err


def _semantic_ids(path: str | None, name: str, num_items: int) -> tuple[torch.Tensor, tuple[int, ...]]:
    """Codes (V+1, T) and codebook sizes from a semantic_ids.parquet, checked against the catalog."""
    from recsys.semantic_ids.codes import read_semantic_ids

    if path is None:
        raise ConfigError(
            f"model {name!r} needs semantic IDs. Fix: add a `sid` section to the experiment config (or set "
            "model.params.semantic_ids to a semantic_ids.parquet built from the same prepared data)"
        )
    sids, _ = read_semantic_ids(Path(path))
    if sids.num_items != num_items:
        raise ConfigError(
            f"{path} has semantic IDs for {sids.num_items} items but the data has {num_items}. "
            "Fix: build the semantic IDs from the same prepared data directory"
        )
    return sids.codes, tuple(sids.codebook_sizes)


def _placeholder_codes(config: GenerativeConfig) -> torch.Tensor:
    """Codes of the right shape, overwritten by the saved state dict."""
    return torch.zeros(config.num_items + 1, len(config.codebook_sizes), dtype=torch.long)
