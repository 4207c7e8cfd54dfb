"""Config dataclasses from user input (YAML, saved files): types checked, unknown keys refused, errors that name the
dotted key and say how to fix it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

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
        return TypeAdapter(cls).validate_python(dict(fields))
    except ValidationError as err:
        raise ConfigError(problems(err, where)) from err


def problems(err: ValidationError, where: str = "") -> str:
    """A pydantic error as '<where><dotted key>: <message>' per problem."""
    return "; ".join(f"{where}{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
