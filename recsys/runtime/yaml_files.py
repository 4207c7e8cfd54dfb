"""Reading the YAML a person writes (experiment and benchmark configs, `--set KEY=VALUE` values), strictly:

- a key given twice in one mapping is an error naming both lines (YAML itself keeps the last one silently: a
  config with `model:` twice would run the second model);
- `1e-3` is the float it looks like (YAML 1.2; PyYAML's YAML 1.1 reads a number without a dot as a string);
- a file that is not UTF-8 is an error naming the file and the encoding it looks like, not a decoding traceback.

Example:
    >>> load_yaml("lr: 1e-3", "example")
    {'lr': 0.001}
    >>> load_yaml("a: 1\\nb: 2\\na: 3\\n", "example")
    Traceback (most recent call last):
    recsys.errors.ConfigError: example: key 'a' is given twice (lines 1 and 3). Fix: keep one of them
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path
from typing import Any

import yaml

from recsys.errors import ConfigError

# YAML 1.2's floats, among them those without a dot (1e-3, 3E+05) that YAML 1.1 leaves as strings
_FLOAT = re.compile(
    r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+"
    r"|\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_BOMS = {codecs.BOM_UTF16_LE: "UTF-16", codecs.BOM_UTF16_BE: "UTF-16", codecs.BOM_UTF32_LE: "UTF-32"}


class _DuplicateKey(yaml.YAMLError):
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


_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def load_yaml(text: str, where: str) -> Any:
    """The YAML document `text` (from `where`, which the error names); ConfigError for invalid YAML or a key twice."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader with stricter mappings
    except _DuplicateKey as err:
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
