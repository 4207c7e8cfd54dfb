"""The model registry: every model family by name (`recsys.models.family.ModelFamily`), the models built from their
config fields and inputs, saved and loaded as one file.

The platform's own families are named here (`BUILTIN_FAMILIES`: each module's `FAMILY`, imported the first time its name
is looked up, so loading a SASRec does not import the generative model); a family defined elsewhere registers with
`register_family` (a test, a notebook), or through the `recsys.model_families` entry point group of an installed
package, whose entries name a `ModelFamily` (loaded the first time a family is looked up; docs/model-families.md). A
model file holds {"format", "name", "config" (the config dataclass's fields), "state_dict"} and is written atomically;
it carries everything the model was built on, so loading needs the file alone.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from recsys.errors import ConfigError, DataError, RecsysError
from recsys.models.family import Input, Model, ModelFamily, ModelInputs
from recsys.runtime.checkpoint import load_checkpoint, save_checkpoint

logger = logging.getLogger(__name__)

FORMAT = 2  # files of an earlier format hold configs of an earlier version of the models
ENTRY_POINT_GROUP = "recsys.model_families"
# the platform's families: name -> the module whose `FAMILY` it is (test_registry checks each module's name)
_BUILTIN_NAMES = ("popularity", "sasrec", "hstu", "query_aware", "two_tower", "generative", "ranker", "domain_adapters")
BUILTIN_FAMILIES = {name: f"recsys.models.{name}" for name in (*_BUILTIN_NAMES, "fusion")}

_FAMILIES: dict[str, ModelFamily[Any, Any]] = {}
_plugins_loaded = False


def register_family(family: ModelFamily[Any, Any]) -> ModelFamily[Any, Any]:
    """Make `family` known by its name; registering the same spec again is a no-op, another under a taken name an
    error."""
    known = _FAMILIES.get(family.name)
    if known is not None and known is not family:
        raise ConfigError(
            f"model family {family.name!r} is registered already (by {known.model.__module__}). Fix: give "
            f"{family.model.__module__}'s family another name"
        )
    _FAMILIES[family.name] = family
    return family


def family_names() -> list[str]:
    _load_plugins()
    return sorted(_FAMILIES.keys() | BUILTIN_FAMILIES.keys())


def model_family(name: str) -> ModelFamily[Any, Any]:
    """The family registered as `name`; ConfigError naming the known ones."""
    _load_plugins()
    if name not in _FAMILIES and name in BUILTIN_FAMILIES:
        _load_builtin(name)
    if name not in _FAMILIES:
        raise ConfigError(f"unknown model {name!r}. Fix: use one of {', '.join(family_names())}")
    return _FAMILIES[name]


def family_of(model: Model[Any]) -> ModelFamily[Any, Any]:
    """The family whose model class `model` is."""
    _load_plugins()
    for name in BUILTIN_FAMILIES.keys() - _FAMILIES.keys():  # a model's class is defined: its module is imported
        if BUILTIN_FAMILIES[name] == type(model).__module__:
            _load_builtin(name)
    for family in _FAMILIES.values():
        if type(model) is family.model:
            return family
    raise ConfigError(f"{type(model).__name__} is the model of no registered family. Fix: register its family")


def _load_builtin(name: str) -> None:
    family = importlib.import_module(BUILTIN_FAMILIES[name]).FAMILY
    assert family.name == name, f"{BUILTIN_FAMILIES[name]}.FAMILY is named {family.name!r}, not {name!r}"
    register_family(family)


def build_model(name: str, params: Mapping[str, Any], num_items: int, inputs: ModelInputs | None = None) -> Model[Any]:
    """A new model of family `name` with `params` (validated against its config dataclass) for V items on `inputs`
    (what the family reads)."""
    return model_family(name).build({**params, "num_items": num_items}, inputs or ModelInputs())


def inputs_read(name: str, params: Mapping[str, Any]) -> frozenset[Input]:
    """What a model of family `name` with `params` reads (the pipeline builds these and no other inputs)."""
    return model_family(name).inputs(params)


def save_model(path: Path, model: Model[Any]) -> None:
    config = dataclasses.asdict(model.config)
    name = family_of(model).name
    save_checkpoint(path, {"format": FORMAT, "name": name, "config": config, "state_dict": model.state_dict()})


def load_model(path: Path) -> tuple[str, Model[Any]]:
    """Rebuild a saved model (on the CPU, in eval mode); returns (its family's name, the model)."""
    if not path.is_file():
        raise RecsysError(f"{path}: model file not found. Fix: train one with `recsys train --config ...`")
    retrain = "train the model again (`recsys train --config CONFIG`)"
    try:
        payload = load_checkpoint(path)
    except Exception as err:  # torch.load of other bytes raises anything from EOFError to UnpicklingError
        why = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        raise DataError(path, f"not a model file this version reads (cut short? {why})", retrain) from err
    if not isinstance(payload, dict) or not {"name", "config", "state_dict"} <= payload.keys():
        keys = sorted(map(str, payload)) if isinstance(payload, dict) else type(payload).__name__
        raise DataError(path, f"not a model file (it holds {keys}, not name, config and state_dict)", retrain)
    if payload.get("format") != FORMAT:
        raise RecsysError(
            f"{path} was written by an earlier version of recsys (model file format {payload.get('format', 1)}, "
            f"this version reads {FORMAT}). Fix: train the model again"
        )
    name = payload["name"]
    model = _reshaped({"name": name, "config": payload["config"]})
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as err:  # parameters renamed or reshaped since it was saved
        raise RecsysError(
            f"{path}: its weights do not fit this version's {name} model ({str(err).splitlines()[0]} ...). "
            "Fix: train the model again with this version"
        ) from err
    return name, model.eval()


def _reshaped(saved: Mapping[str, Any]) -> Model[Any]:
    """An untrained model of a saved {"name", "config"}; its state dict (and its parts') fills it."""
    return model_family(saved["name"]).reshaped(saved["config"], _reshaped)


def _load_plugins() -> None:
    """Register the families that installed packages name under `ENTRY_POINT_GROUP` (once per process)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        family = entry.load()
        if not isinstance(family, ModelFamily):
            raise ConfigError(
                f"entry point {entry.name} = {entry.value} of group {ENTRY_POINT_GROUP} is a "
                f"{type(family).__name__}, not a ModelFamily. Fix: point it at the module's ModelFamily"
            )
        register_family(family)
        logger.info("model family %r registered from %s", family.name, entry.value)
