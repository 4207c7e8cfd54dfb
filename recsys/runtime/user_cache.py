"""Where recsys keeps what it can make again (an LLM's answers, a converted model) when no work dir holds it: the
user's cache directory, never the current directory.

`$RECSYS_CACHE_DIR` when set, else `$XDG_CACHE_HOME/recsys` (the XDG base-directory convention), else
`~/.cache/recsys`.

Example:
    >>> user_cache_dir("enrich", environ={"XDG_CACHE_HOME": "/var/cache/me"})
    PosixPath('/var/cache/me/recsys/enrich')
    >>> user_cache_dir("enrich", environ={"RECSYS_CACHE_DIR": "/data/cache", "XDG_CACHE_HOME": "/var/cache/me"})
    PosixPath('/data/cache/enrich')
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CACHE_ENV = "RECSYS_CACHE_DIR"


def user_cache_dir(*parts: str, environ: Mapping[str, str] | None = None) -> Path:
    """The user's recsys cache directory (module docstring), joined with `parts`; not created here."""
    env = os.environ if environ is None else environ
    if env.get(CACHE_ENV):
        root = Path(env[CACHE_ENV]).expanduser()
    elif env.get("XDG_CACHE_HOME"):
        root = Path(env["XDG_CACHE_HOME"]).expanduser() / "recsys"
    else:
        root = Path.home() / ".cache" / "recsys"
    return root.joinpath(*parts)
