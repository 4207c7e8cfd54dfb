"""The model directory: everything needed to evaluate a trained model and recommend with it.

    model.pt        name, config and weights (`recsys.models.registry`)
    config.yaml     the experiment config, as plain data (the pipeline's `ExperimentConfig`, dumped)
    metrics.json    valid/test metrics (+ the cold-start slices), the popularity baseline's valid metrics on the same
                    data (`popularity_valid`, the champion gate's bar), best epoch, timings
    items.parquet, users.parquet   the id maps of the training data
    data.json       where the training data lives (for user histories), the domain it was restricted to, and
                    the data's meta.json
    valid_ranks.npz every validation user's target rank (`recsys.artifacts.per_user`): what pairs two models' validation
                    metrics user by user (the champion gate's paired test); absent in directories written before
Written atomically: a crash leaves the previous directory (or none), never a partial one.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from recsys.data.schema import ITEMS_FILE, META_FILE, PREPARE_HINT, USERS_FILE
from recsys.errors import DataError, RecsysError
from recsys.models.family import Model
from recsys.models.registry import load_model, save_model
from recsys.runtime.atomic import atomic_directory
from recsys.runtime.json_files import read_json_object, read_json_shaped
from recsys.runtime.validation import problems

if TYPE_CHECKING:  # the data and the ranks are read and written here, not needed to find a model's files
    from recsys.artifacts.per_user import PerUserRanks
    from recsys.data.prepared import SequenceData

MODEL_FILE = "model.pt"
METRICS_FILE = "metrics.json"
DATA_FILE = "data.json"
CONFIG_FILE = "config.yaml"
VALID_RANKS_FILE = "valid_ranks.npz"  # every validation user's target rank (`recsys.artifacts.per_user`)
POPULARITY_VALID = "popularity_valid"  # metrics.json: the popularity baseline on the validation split
RETRAIN = "train the model again (`recsys train --config CONFIG`)"  # the fix for a model directory's corrupt file


@dataclass(frozen=True)
class TrainedModel:
    name: str  # the model's family
    model: Model[Any]
    data: SequenceData
    metrics: dict[str, Any]


def write_model_dir(
    out_dir: Path,
    config: Mapping[str, Any],
    model: Model[Any],
    data_dir: Path,
    metrics: dict[str, Any],
    *,
    valid_ranks: PerUserRanks | None = None,
) -> None:
    """Write the model directory for `model` trained on `data_dir` (restricted to the config's `data.domain`, if set),
    with the ranks of every validation user (None: the whole validation split was not ranked).

    Args:
        config: the experiment config as plain data (JSON types), written as config.yaml.
    """
    meta = read_json_object(data_dir / META_FILE, PREPARE_HINT)
    data = {"data_dir": str(data_dir.resolve()), "domain": config.get("data", {}).get("domain"), "meta": meta}
    with atomic_directory(out_dir, marker=MODEL_FILE) as tmp:
        save_model(tmp / MODEL_FILE, model)
        (tmp / CONFIG_FILE).write_text(yaml.safe_dump(dict(config), sort_keys=False))
        (tmp / METRICS_FILE).write_text(json.dumps(metrics, indent=2))
        (tmp / DATA_FILE).write_text(json.dumps(data, indent=2))
        if valid_ranks is not None:
            valid_ranks.write(tmp / VALID_RANKS_FILE)
        for name in (ITEMS_FILE, USERS_FILE):
            shutil.copyfile(data_dir / name, tmp / name)


def trained_data_dir(model_dir: Path) -> Path:
    """The prepared data directory the model was trained on (recorded in data.json)."""
    return Path(_data_record(model_dir)["data_dir"])


def trained_config_name(model_dir: Path) -> str:
    """The name of the experiment config that trained the model (config.yaml's `name`)."""
    return _config_record(model_dir).name


def trained_text_fields(model_dir: Path) -> tuple[str, ...]:
    """The item columns whose text the model's content embeddings embed (its experiment's `content.text_fields`)."""
    content = _config_record(model_dir).content
    if content is None:
        problem = "not a model's config.yaml of this version (content: missing)"
        raise DataError(model_dir / CONFIG_FILE, problem, RETRAIN)
    return content.text_fields


def model_sha256(model_dir: Path, key: str | None = None) -> str:
    """SHA-256 of a model directory's weights file: what downstream steps fingerprint (`key`: the config key naming
    the directory, for the error when it is not one)."""
    check_model_dir(model_dir, key)
    return file_sha256(model_dir / MODEL_FILE)


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def trained_data(model_dir: Path, data_dir: Path | None = None) -> SequenceData:
    """The model's data: `data_dir`, or the directory it was trained on, restricted to the domain it was trained on."""
    from recsys.data.prepared import load_prepared

    record = _data_record(model_dir)
    return load_prepared(data_dir or Path(record["data_dir"]), record.get("domain"))


def load_model_dir(model_dir: Path, data_dir: Path | None = None) -> TrainedModel:
    """Load a model directory and its data (`trained_data`)."""
    check_model_dir(model_dir)
    data = trained_data(model_dir, data_dir)
    name, model = load_model(model_dir / MODEL_FILE)
    if data.num_items != model.config.num_items:
        raise RecsysError(
            f"{data_dir or trained_data_dir(model_dir)} has {data.num_items} items but the model was trained on "
            f"{model.config.num_items}. Fix: pass the --data-dir the model was trained on"
        )
    return TrainedModel(name=name, model=model, data=data, metrics=read_metrics(model_dir))


class _Metrics(BaseModel):
    """What is read of a metrics.json: the validation and test metrics."""

    model_config = ConfigDict(extra="allow")

    valid: dict[str, Any]
    test: dict[str, Any]


def read_metrics(model_dir: Path) -> dict[str, Any]:
    """The model directory's metrics.json; `DataError` naming it when it is not JSON (cut short) or lacks the
    validation and test metrics."""
    return read_json_shaped(model_dir / METRICS_FILE, _Metrics, "a model's metrics.json", RETRAIN)


def load_trained_model(model_dir: Path, key: str) -> tuple[str, Model[Any]]:
    """(its family's name, the trained model) of `model_dir`, which another model is built on (`key` names the config
    key that names it), frozen."""
    check_model_dir(model_dir, key)
    name, model = load_model(model_dir / MODEL_FILE)
    return name, model.requires_grad_(False)


def check_model_dir(model_dir: Path, key: str | None = None) -> None:
    """RecsysError unless `model_dir` holds a trained model (`key`: the config key that names the directory, an
    upstream model's; None for one given on the command line)."""
    if (model_dir / MODEL_FILE).is_file():
        return
    fix = (
        "train that model first (its config's command), or correct the path"
        if key
        else "pass a model directory written by `recsys train` (WORK/models/NAME)"
    )
    raise RecsysError(f"{key + ': ' if key else ''}{model_dir} is not a model directory (no {MODEL_FILE}). Fix: {fix}")


class _DataRecord(BaseModel):
    """What is read of a data.json: where the training data lives and the domain it was restricted to."""

    model_config = ConfigDict(extra="allow")

    data_dir: str
    domain: str | None = None


def _data_record(model_dir: Path) -> dict[str, Any]:
    return read_json_shaped(model_dir / DATA_FILE, _DataRecord, "a model's data.json", RETRAIN)


class _Content(BaseModel):
    model_config = ConfigDict(extra="allow")

    text_fields: tuple[str, ...]


class _ConfigRecord(BaseModel):
    """What is read of a model directory's config.yaml: its experiment's name and the item text it embeds."""

    model_config = ConfigDict(extra="allow")

    name: str
    content: _Content | None = None  # read for a content-first model only


def _config_record(model_dir: Path) -> _ConfigRecord:
    """The model directory's config.yaml; `DataError` naming it when it is not YAML or lacks what is read of it."""
    path = model_dir / CONFIG_FILE
    if not path.is_file():
        raise DataError(path, "no such file" if not path.exists() else "not a file", RETRAIN)
    try:
        config = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as err:
        raise DataError(path, f"not UTF-8 text (byte {err.start}): not a YAML file", RETRAIN) from err
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = f"not valid YAML ({getattr(err, 'problem', None) or 'unreadable'}{where}; cut short?)"
        raise DataError(path, problem, RETRAIN) from err
    if not isinstance(config, dict):
        raise DataError(path, f"holds a YAML {type(config).__name__}, not the experiment config expected", RETRAIN)
    try:
        return _ConfigRecord.model_validate(config)
    except ValidationError as err:
        raise DataError(path, f"not a model's config.yaml of this version ({problems(err)})", RETRAIN) from err
