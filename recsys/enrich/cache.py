"""The enrichment cache: one row per (item text, prompt version, model), written as soon as it is answered.

A SQLite file (one writer at a time, each batch one transaction), so a run stopped by a crash, a kill or Ctrl-C
loses at most the batch under way, and the next run asks only for what is missing; the daily run over a grown
catalogue asks only for new or changed texts. A failed answer is kept too (its `problem` says why), so it is counted
and not asked again with the same prompt and model; `recsys enrich --retry-failed` asks again.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

CACHE_FILE = "enrich-cache.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS answers (
    key TEXT PRIMARY KEY,      -- sha256 of (text, prompt version, model)
    status TEXT NOT NULL,      -- ok | failed
    record TEXT,               -- the record as JSON (status ok)
    problem TEXT,              -- why it is not a record (status failed)
    truncated TEXT NOT NULL,   -- fields cut at their token cap, comma-separated
    attempts INTEGER NOT NULL,
    seconds REAL NOT NULL,     -- of its batch, shared by its rows
    model TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    backend TEXT NOT NULL,
    created_at REAL NOT NULL
)
"""


@dataclass(frozen=True)
class Answer:
    """One item's answer, as cached."""

    key: str
    status: str
    record: str | None
    problem: str | None
    truncated: str
    attempts: int
    seconds: float
    model: str
    prompt_version: str
    backend: str
    created_at: float


def answer_key(text: str, prompt_version: str, model: str) -> str:
    return hashlib.sha256("\x1f".join((text, prompt_version, model)).encode()).hexdigest()


class EnrichCache:
    """Answers by key, in `<folder>/enrich-cache.sqlite`."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / CACHE_FILE
        self._db = sqlite3.connect(self.path, timeout=60)
        self._db.execute("PRAGMA journal_mode=WAL")  # a reader (the dashboard, a test) never blocks the writer
        self._db.execute(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def get(self, keys: Sequence[str]) -> dict[str, Answer]:
        found: dict[str, Answer] = {}
        for start in range(0, len(keys), 900):  # SQLite's limit on bound parameters
            chunk = keys[start : start + 900]
            marks = ",".join("?" * len(chunk))
            rows = self._db.execute(f"SELECT * FROM answers WHERE key IN ({marks})", chunk)
            found.update((row[0], Answer(*row)) for row in rows)
        return found

    def put(self, answers: Iterable[Answer]) -> None:
        self._insert("REPLACE", answers)

    def seed(self, answers: Iterable[Answer]) -> int:
        """Add `answers` made elsewhere (a records file) where the cache has none for their key; returns how many
        were added (an answer this cache already holds is kept: it is the newer)."""
        before = len(self)
        self._insert("IGNORE", answers)
        return len(self) - before

    def _insert(self, on_conflict: str, answers: Iterable[Answer]) -> None:
        with self._db:  # one transaction: the batch is there whole or not at all
            self._db.executemany(
                f"INSERT OR {on_conflict} INTO answers VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                [(a.key, a.status, a.record, a.problem, a.truncated, a.attempts, a.seconds, a.model,
                  a.prompt_version, a.backend, a.created_at) for a in answers],
            )  # fmt: skip

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0])
