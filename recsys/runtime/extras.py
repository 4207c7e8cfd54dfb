"""Optional parts of the install (`pyproject.toml` extras): a module of one is imported where a feature uses it, and
its absence is a `MissingExtra` naming the extra to install, not an ImportError from deep inside a call.

Example:
    >>> json = optional("json", extra="serve", feature="the online API")  # a module that is there is returned
    >>> optional("no_such_module_xyz", extra="serve", feature="the online API")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    recsys.errors.MissingExtra: the online API needs ... 'no_such_module_xyz', ... Fix: pip install 'recsys[serve]'
"""

from __future__ import annotations

import importlib
from types import ModuleType

from recsys.errors import MissingExtra


def optional(module: str, *, extra: str, feature: str) -> ModuleType:
    """`module` imported; `MissingExtra` naming `extra` when its top-level package is not installed (an ImportError
    inside an installed package is that package's own failure, and propagates)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is None or module.split(".")[0] != err.name.split(".")[0]:
            raise
        raise MissingExtra(feature, extra, err.name.split(".")[0]) from err
