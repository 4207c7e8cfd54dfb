"""Reading the YAML a person writes (experiment and benchmark configs, `--set KEY=VALUE` values), strictly:

- a key given twice in one mapping is an error naming both lines (YAML itself keeps the last one silently: a
  config with `model:` twice would run the second model);
- `1e-3` is the float it looks like (YAML 1.2; PyYAML's YAML 1.1 reads a number without a dot as a string);
- a file that is not UTF-8 is an error naming the file and the encoding it looks like, not a decoding traceback;
- a number is bounded: an integer past int64 or a float literal past the largest float is an error naming its line
  (Python refuses to read an integer of more than 4,300 digits, deep inside the parser, and nothing the project
  configures counts past int64; a float that large would become inf silently).

Example:
    >>> load_yaml("lr: 1e-3", "example")
    {'lr': 0.001}
    >>> load_yaml("a: 1\\nb: 2\\na: 3\\n", "example")
    Traceback (most recent call last):
    recsys.errors.ConfigError: example: key 'a' is given twice (lines 1 and 3). Fix: keep one of them
    >>> load_yaml("dim: 99999999999999999999", "example")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    recsys.errors.ConfigError: example: the number on line 1 (99999999999999999999) is too large: ... Fix: write a ...
"""

from __future__ import annotations

import codecs
import math
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from recsys.errors import ConfigError

# YAML 1.2's floats, among them those without a dot (1e-3, 3E+05) that YAML 1.1 leaves as strings
_FLOAT = re.compile(
    r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+"
    r"|\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_INT64 = (-(2**63), 2**63 - 1)  # what a number in a config may be: torch, numpy and JSON readers all hold it
_INFINITE = re.compile(r"^[-+]?\.(?:inf|Inf|INF)$")  # a float written as infinite on purpose
_BOMS = {codecs.BOM_UTF16_LE: "UTF-16", codecs.BOM_UTF16_BE: "UTF-16", codecs.BOM_UTF32_LE: "UTF-32"}


class _DuplicateKey(yaml.YAMLError):
    pass


class _TooLarge(yaml.YAMLError):
    pass


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in lines:
                raise _DuplicateKey(
                    f"key {key!r} is given twice (lines {lines[key]} and {line}). Fix: keep one of them"
                )
            lines[key] = line
        return super().construct_mapping(node, deep)

    def construct_bounded_int(self, node: yaml.ScalarNode) -> int:
        try:  # Python refuses to read an integer of more than 4,300 digits (sys.get_int_max_str_digits)
            value: int = super().construct_yaml_int(node)
        except ValueError:
            raise _TooLarge(_too_large(node, f"an integer must lie in [{_INT64[0]}, {_INT64[1]}]")) from None
        if not _INT64[0] <= value <= _INT64[1]:
            raise _TooLarge(_too_large(node, f"an integer must lie in [{_INT64[0]}, {_INT64[1]}]"))
        return value

    def construct_bounded_float(self, node: yaml.ScalarNode) -> float:
        value: float = super().construct_yaml_float(node)
        if math.isinf(value) and not _INFINITE.match(str(node.value)):  # digits past 1.8e308 read as inf
            raise _TooLarge(_too_large(node, f"a float must lie within ±{sys.float_info.max:.2g} (.inf is infinite)"))
        return value


def _too_large(node: yaml.ScalarNode, bound: str) -> str:
    text = str(node.value)
    shown = text if len(text) <= 40 else f"{text[:20]}...{text[-10:]}, {len(text):,} characters"
    return f"the number on line {node.start_mark.line + 1} ({shown}) is too large: {bound}. Fix: write a smaller value"


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_bounded_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_bounded_float)
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def load_yaml(text: str, where: str) -> Any:
    """The YAML document `text` (from `where`, which the error names); ConfigError for invalid YAML or a key twice."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader with stricter mappings
    except (_DuplicateKey, _TooLarge) as err:
        raise ConfigError(f"{where}: {err}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML ({err}). Fix: correct the syntax at the position shown") from err


def read_yaml(path: Path) -> Any:
    """The YAML document of the file at `path` (UTF-8); ConfigError naming the file for any other encoding."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        looks = next((name for bom, name in _BOMS.items() if data.startswith(bom)), None)
        what = (
            f"it looks like {looks} (its first bytes are a {looks} byte-order mark)"
            if looks
            else f"line {line} holds the byte {data[err.start : err.start + 1]!r}"
        )
        raise ConfigError(f"{path}: not UTF-8 text: {what}. Fix: save the file as UTF-8") from err
    return load_yaml(text.removeprefix("\ufeff"), str(path))
