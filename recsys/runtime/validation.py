"""Config dataclasses from user input (YAML, saved files): types checked, unknown keys refused, errors that name the
dotted key and say how to fix it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from recsys.errors import ConfigError

T = TypeVar("T")


def config_from(cls: type[T], fields: Mapping[str, Any], where: str) -> T:
    """`cls` (a dataclass) from `fields`, validated; ConfigError naming each bad key as `where` + its name.

    Example:
        >>> from recsys.evaluation import EvalConfig
        >>> config_from(EvalConfig, {"ks": [10]}, "eval.").ks
        (10,)
        >>> config_from(EvalConfig, {"k": [10]}, "eval.")
        Traceback (most recent call last):
        recsys.errors.ConfigError: eval.k: unknown key (known: ks, exclude_seen, batch_size)
    """
    known = [field.name for field in dataclasses.fields(cls)]  # type: ignore[arg-type]
    unknown = [key for key in fields if key not in known]
    if unknown:
        raise ConfigError("; ".join(f"{where}{key}: unknown key (known: {', '.join(known)})" for key in unknown))
    try:
        holder = _strict_input(cls).model_validate({"value": dict(fields)})
    except ValidationError as err:
        raise ConfigError(_nested_problems(err, where)) from err
    value: T = holder.value  # type: ignore[attr-defined]
    return value


_STRICT_INPUTS: dict[type, type[BaseModel]] = {}  # built once per config class


def _strict_input(cls: type) -> type[BaseModel]:
    """A model holding one `cls`: its config refuses unknown keys, and nested dataclasses inherit that (a bare
    TypeAdapter would drop a nested dataclass's unknown keys silently)."""
    if cls not in _STRICT_INPUTS:
        strict = ConfigDict(extra="forbid")
        _STRICT_INPUTS[cls] = create_model(f"{cls.__name__}Input", __config__=strict, value=(cls, ...))
    return _STRICT_INPUTS[cls]


def _nested_problems(err: ValidationError, where: str) -> str:
    """`problems` of a `_strict_input` validation: the unknown keys of a nested section grouped under its key."""
    unknown: dict[str, list[str]] = {}
    others = []
    for e in err.errors():
        loc = [str(part) for part in e["loc"][1:]]  # [0] is the holder's field
        if e["type"] == "unexpected_keyword_argument":
            unknown.setdefault(".".join(loc[:-1]), []).append(loc[-1])
        else:
            others.append(f"{where}{'.'.join(loc)}: {e['msg']}")
    return "; ".join([*others, *(f"{where}{parent}: unknown keys {keys}" for parent, keys in unknown.items())])


def problems(err: ValidationError, where: str = "") -> str:
    """A pydantic error as '<where><dotted key>: <message>' per problem."""
    return "; ".join(f"{where}{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
