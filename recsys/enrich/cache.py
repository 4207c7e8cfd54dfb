"""The enrichment cache: one row per (item text, prompt version, model), written as soon as it is answered.

A SQLite file (one writer at a time, each batch one transaction), so a run stopped by a crash, a kill, Ctrl-C or a
server gone down loses at most the batch under way, and the next run asks only for what is missing; the daily run
over a grown catalogue asks only for new or changed texts. A failed answer is kept too (its `problem` says why), so it
is counted and not asked again with the same prompt and model; `recsys enrich --retry-failed` asks again.

Its format is version `FORMAT_VERSION` (SQLite's `user_version`; a cache of before the version, 0, with the same
table, is the same format). Every row is checked as it is read (`answer_problem`): a row that does not pass (written
by an older version, or by hand) is dropped with a warning saying how many, and its item is asked again. A file that
is not such a cache is refused, never overwritten.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from recsys.enrich.answer import Answer, answer_problem
from recsys.errors import DataError

logger = logging.getLogger(__name__)

CACHE_FILE = "enrich-cache.sqlite"
FORMAT_VERSION = 1

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
_COLUMNS = ["key", "status", "record", "problem", "truncated", "attempts", "seconds", "model", "prompt_version",
            "backend", "created_at"]  # fmt: skip
_ELSEWHERE = "pass another --cache-dir"


class EnrichCache:
    """Answers by key, in `<folder>/enrich-cache.sqlite`."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / CACHE_FILE
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise DataError(folder, f"the enrich cache's folder cannot be made ({err.strerror})", _ELSEWHERE) from err
        try:
            self._db = sqlite3.connect(self.path, timeout=60)
            self._open()
        except sqlite3.Error as err:
            raise DataError(
                self.path,
                f"cannot be opened as an enrich cache ({err})",
                f"move the file away (the cache is made again by asking again) or {_ELSEWHERE}",
            ) from err

    def _open(self) -> None:
        """Check the file is a cache of this format (before anything is written to it), then make it one."""
        version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
        if version not in (0, FORMAT_VERSION):
            raise sqlite3.DatabaseError(f"its format is version {version}, this version reads {FORMAT_VERSION}")
        columns = [row[1] for row in self._db.execute("PRAGMA table_info(answers)")]
        if columns and columns != _COLUMNS:
            raise sqlite3.DatabaseError(f"its table of answers has the columns {columns}, not {_COLUMNS}")
        self._db.execute("PRAGMA journal_mode=WAL")  # a reader (the dashboard, a test) never blocks the writer
        with self._db:
            self._db.execute(_SCHEMA)
            self._db.execute(f"PRAGMA user_version = {FORMAT_VERSION}")

    def close(self) -> None:
        self._db.close()

    def get(self, keys: Sequence[str]) -> dict[str, Answer]:
        """The cached answers of `keys`; a row that fails its check is dropped (its item is asked again)."""
        found: dict[str, Answer] = {}
        bad: dict[str, str] = {}
        for start in range(0, len(keys), 900):  # SQLite's limit on bound parameters
            chunk = keys[start : start + 900]
            marks = ",".join("?" * len(chunk))
            for row in self._execute(f"SELECT * FROM answers WHERE key IN ({marks})", chunk):
                answer = Answer(*row)
                problem = answer_problem(answer)
                if problem is None:
                    found[answer.key] = answer
                else:
                    bad[answer.key] = problem
        if bad:
            self._drop(bad)
        return found

    def put(self, answers: Iterable[Answer]) -> None:
        self._insert("REPLACE", answers)

    def seed(self, answers: Iterable[Answer]) -> int:
        """Add `answers` made elsewhere (a records file, checked by its reader) where the cache has none for their
        key; returns how many were added (an answer this cache already holds is kept: it is the newer)."""
        before = len(self)
        self._insert("IGNORE", answers)
        return len(self) - before

    def _drop(self, bad: dict[str, str]) -> None:
        example = next(iter(bad.values()))
        logger.warning("enrich cache %s: %d answers fail their check (written by an older version or by hand; e.g. "
                       "%s): dropped, their items are asked again", self.path, len(bad), example)  # fmt: skip
        with self._db:
            self._db.executemany("DELETE FROM answers WHERE key = ?", [(key,) for key in bad])

    def _insert(self, on_conflict: str, answers: Iterable[Answer]) -> None:
        rows = [(a.key, a.status, a.record, a.problem, a.truncated, a.attempts, a.seconds, a.model,
                 a.prompt_version, a.backend, a.created_at) for a in answers]  # fmt: skip
        try:
            with self._db:  # one transaction: the batch is there whole or not at all
                self._db.executemany(f"INSERT OR {on_conflict} INTO answers VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
        except sqlite3.Error as err:
            raise DataError(self.path, f"answers cannot be written to the enrich cache ({err})",
                            f"free space or make it writable, or {_ELSEWHERE}; the answers written before are "
                            "kept") from err  # fmt: skip

    def _execute(self, sql: str, parameters: Sequence[str]) -> list[tuple[Any, ...]]:
        try:
            return self._db.execute(sql, parameters).fetchall()
        except sqlite3.Error as err:
            raise DataError(self.path, f"the enrich cache cannot be read ({err})", _ELSEWHERE) from err

    def __len__(self) -> int:
        return int(self._execute("SELECT COUNT(*) FROM answers", [])[0][0])
