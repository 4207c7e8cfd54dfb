"""Model registry: build a model from its name and config fields; save and load model files.

A model file holds {"name", "config" (dataclass fields), "state_dict"} and is written atomically.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from recsys.errors import ConfigError, RecsysError
from recsys.models.popularity import Popularity, PopularityConfig
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.training.checkpoint import load_checkpoint, save_checkpoint

Model = Popularity | SASRec

MODELS: dict[str, tuple[type, type[Model]]] = {
    "popularity": (PopularityConfig, Popularity),
    "sasrec": (SASRecConfig, SASRec),
}


def build_model(name: str, params: dict[str, Any], num_items: int) -> Model:
    """Instantiate model `name` with `params` (validated against its config dataclass) for V items."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}. Fix: use one of {', '.join(sorted(MODELS))}")
    config_cls, model_cls = MODELS[name]
    try:
        config: Any = TypeAdapter(config_cls).validate_python({**params, "num_items": num_items})
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"model {name!r}: {problems}. Fix: correct model.params") from err
    return model_cls(config)


def save_model(path: Path, name: str, model: Model) -> None:
    config = dataclasses.asdict(model.config)
    save_checkpoint(path, {"name": name, "config": config, "state_dict": model.state_dict()})


def load_model(path: Path) -> tuple[str, Model]:
    """Rebuild a saved model (on the CPU, in eval mode); returns (name, model)."""
    if not path.is_file():
        raise RecsysError(f"{path}: model file not found. Fix: train one with `recsys train --config ...`")
    payload = load_checkpoint(path)
    config = dict(payload["config"])
    model = build_model(payload["name"], config, config.pop("num_items"))
    model.load_state_dict(payload["state_dict"])
    return payload["name"], model.eval()
