"""Names that become one file or directory name (an experiment's `name`: `WORK/models/NAME`, `WORK/data/NAME`, ...).

A name is checked where it is read (the config), and again where a path is built from it (`child`), so a name that
slipped past the first check (a config built in Python with `model_construct`) still cannot leave its parent: one
path part of letters, digits, `.`, `_` and `-`, starting with a letter or digit (not `.`: no hidden files, no `..`),
at most `MAX_NAME` characters. No `/`, `\\`, NUL, spaces or other characters a shell or another OS reads otherwise.

Example:
    >>> check_name("beauty-sasrec_v2.1", "name")
    'beauty-sasrec_v2.1'
    >>> check_name("../../esc", "name")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    recsys.errors.ConfigError: name: '../../esc' is not a valid name (it becomes a directory name under the work dir...
"""

from __future__ import annotations

import re
from pathlib import Path

from recsys.errors import ConfigError

MAX_NAME = 100  # characters: well below any file system's limit on one path part (255 bytes) with room for suffixes
_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME - 1}}}")
ALLOWED = f"1 to {MAX_NAME} letters, digits, '.', '_' or '-', starting with a letter or digit"


def check_name(value: str, key: str) -> str:
    """`value` when it is a valid name (module docstring), else a ConfigError naming `key`, the value and the rule."""
    if _NAME.fullmatch(value):
        return value
    shown = repr(value) if len(value) <= 60 else f"{value[:40]!r}... ({len(value):,} characters)"
    raise ConfigError(
        f"{key}: {shown} is not a valid name (it becomes a directory name under the work dir, e.g. WORK/models/NAME). "
        f"Fix: use {ALLOWED}, e.g. beauty-sasrec"
    )


def child(parent: Path, name: str, key: str = "name") -> Path:
    """`parent / name`, once `name` is checked to be a valid name (so the path stays directly under `parent`).

    Example:
        >>> child(Path("runs/models"), "tiny-sasrec").as_posix()
        'runs/models/tiny-sasrec'
    """
    path = parent / check_name(name, key)
    assert path.parent == parent, f"{name!r} left {parent}"  # what the name's characters already exclude
    return path
