"""Config dataclasses from user input (YAML, saved files): types checked strictly (a bool is not a number, a string
is not a float: the input goes through pydantic's strict JSON mode, where lists become tuples and strings paths as
JSON has no other way to write them), unknown keys refused, errors that name the dotted key and say how to fix it.

A config dataclass states its bounds on the field (`dim: PositiveInt = 64`, `dropout: Fraction = 0.5`) and checks
across fields in `__post_init__`, raising a ValueError whose message starts with the field it is about
("num_heads (3) should divide dim (64)"): `config_from` shows it after the key's prefix.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from recsys.errors import ConfigError

T = TypeVar("T")

Fraction = Annotated[float, Field(ge=0.0, lt=1.0)]  # in [0, 1): a dropout rate, a decay


def config_from(cls: type[T], fields: Mapping[str, Any], where: str, filled: Mapping[str, Any] | None = None) -> T:
    """`cls` (a dataclass) from `fields`, validated; ConfigError naming each bad key as `where` + its name.

    Args:
        cls: the config dataclass.
        fields: the user's keys and values.
        where: the dotted prefix of the keys in the user's file, e.g. "model.params.".
        filled: fields the program fills in (from the data, say), not the user: a key among them is unknown, and
            these values stand in for them.

    Example:
        >>> from recsys.evaluation import EvalConfig
        >>> config_from(EvalConfig, {"ks": [10]}, "eval.").ks
        (10,)
        >>> config_from(EvalConfig, {"k": [10]}, "eval.")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        recsys.errors.ConfigError: eval.k: unknown key (known: ks, exclude_seen, batch_size, item_block, ...)
    """
    filled = filled or {}
    known = [field.name for field in dataclasses.fields(cls) if field.name not in filled]  # type: ignore[arg-type]
    unknown = [key for key in fields if key not in known]
    if unknown:
        raise ConfigError("; ".join(f"{where}{key}: unknown key (known: {', '.join(known)})" for key in unknown))
    try:
        holder = _strict_input(cls).model_validate_json(as_json({"value": {**fields, **filled}}), strict=True)
    except ValidationError as err:
        raise ConfigError(_nested_problems(err, where)) from err
    value: T = holder.value  # type: ignore[attr-defined]
    return value


def as_json(value: Any) -> str:
    """`value` (YAML as parsed, a saved config) as JSON text, for pydantic's strict JSON validation; what JSON cannot
    hold (a YAML date) becomes its text, which the field then refuses by name."""
    return json.dumps(value, default=str)


_STRICT_INPUTS: dict[type, type[BaseModel]] = {}  # built once per config class


def _strict_input(cls: type) -> type[BaseModel]:
    """A model holding one `cls`: its config refuses unknown keys, and nested dataclasses inherit that (a bare
    TypeAdapter would drop a nested dataclass's unknown keys silently)."""
    if cls not in _STRICT_INPUTS:
        strict = ConfigDict(extra="forbid")
        _STRICT_INPUTS[cls] = create_model(f"{cls.__name__}Input", __config__=strict, value=(cls, ...))
    return _STRICT_INPUTS[cls]


def _nested_problems(err: ValidationError, where: str) -> str:
    """`problems` of a `_strict_input` validation: the unknown keys of a nested section grouped under its key, a
    `__post_init__` check's message (it starts with its field) after the prefix of its dataclass."""
    unknown: dict[str, list[str]] = {}
    others = []
    for e in err.errors():
        loc = [str(part) for part in e["loc"][1:]]  # [0] is the holder's field
        if e["type"] == "unexpected_keyword_argument":
            unknown.setdefault(".".join(loc[:-1]), []).append(loc[-1])
        elif e["type"] == "value_error":
            others.append(f"{where}{''.join(part + '.' for part in loc)}{e['ctx']['error']}")
        else:
            others.append(f"{where}{'.'.join(loc)}: {e['msg']}")
    return "; ".join([*others, *(f"{where}{parent}: unknown keys {keys}" for parent, keys in unknown.items())])


def problems(err: ValidationError, where: str = "") -> str:
    """A pydantic error as '<where><dotted key>: <message>' per problem (a model-wide check's: '<where><message>')."""
    # a validator's own ValueError reads as its message (pydantic puts "Value error, " before it)
    said = []
    for e in err.errors():
        key = f"{where}{'.'.join(map(str, e['loc']))}" if e["loc"] else where.rstrip(". ")
        message = e["msg"].removeprefix("Value error, ")
        said.append(f"{key}: {message}" if key else message)
    return "; ".join(said)


def check_heads(num_heads: int, dim: int) -> None:
    """A config's `__post_init__` check: attention splits `dim` into `num_heads` heads of equal size.

    Example:
        >>> check_heads(3, 64)
        Traceback (most recent call last):
        ValueError: num_heads: 3 does not divide dim (64) into equal attention heads; use a divisor of 64
    """
    if dim % num_heads:
        raise ValueError(
            f"num_heads: {num_heads} does not divide dim ({dim}) into equal attention heads; use a divisor of {dim}"
        )
