"""Fixtures for the features/ tests: small raw files written into tmp_path."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import pytest

# Three users with >= 3 items each, plus items.csv with a quoted comma in a title.
P5_SEQUENCES = "u1 a b c d\nu2 b c e\nu3 a c e f\n"
P5_ITEMS = 'item_id,title\na,Alpha\nb,"Bravo, the sequel"\nc,Charlie\nd,Delta\ne,Echo\nf,Foxtrot\n'


@pytest.fixture
def write(tmp_path: Path) -> Callable[..., Path]:
    """Write `content` (str or bytes) to tmp_path/name, gzipped when `gz=True`; return the path."""

    def _write(name: str, content: str | bytes, *, gz: bool = False) -> Path:
        data = content.encode("utf-8") if isinstance(content, str) else content
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
        return path

    return _write


@pytest.fixture
def p5_dir(write: Callable[..., Path], tmp_path: Path) -> Path:
    """A small P5-form directory with user_sequence.txt and items.csv."""
    write("amazon-toys/user_sequence.txt", P5_SEQUENCES)
    write("amazon-toys/items.csv", P5_ITEMS)
    return tmp_path / "amazon-toys"
