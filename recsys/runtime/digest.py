"""Hashing files of any size into a running digest, a block at a time (inputs and prepared data may not fit in
memory)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

BLOCK_BYTES = 1 << 20


def feed_file(digest: Any, path: Path) -> None:
    """Feed the bytes of `path` to `digest` (a hashlib object), a block at a time."""
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(BLOCK_BYTES), b""):
            digest.update(block)
