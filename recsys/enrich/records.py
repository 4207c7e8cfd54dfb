"""The records file, item_metadata.parquet: written by a run (`write_records`), and read back as answers to reuse
(`read_answers`: a file made elsewhere, `recsys enrich --records`).

A records file given by the user is checked whole before anything of it enters the cache: every column's type (the
schema a run writes), then every row (`answer_problem`: a status of ok or failed, an ok row's fields a valid record
whose category is in the prompt's list, with the record's bounds — a description of over 400 characters is refused,
not cut — keywords a list of strings, counts and times numbers). A file with a bad column or row is refused whole,
naming the rows, so nothing is taken from it by halves.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from recsys.data.schema import ITEM_ID
from recsys.enrich.answer import Answer, answer_problem
from recsys.enrich.record import FIELDS
from recsys.errors import DataError
from recsys.runtime.atomic import atomic_file

SCHEMA: dict[str, pl.DataType] = {  # every column typed: a run with no records writes the same schema
    ITEM_ID: pl.String(),
    "key": pl.String(),
    "status": pl.String(),
    "category": pl.String(),
    "brand": pl.String(),
    "keywords": pl.List(pl.String()),
    "description": pl.String(),
    "queries": pl.List(pl.String()),
    "problem": pl.String(),
    "truncated": pl.String(),
    "attempts": pl.Int64(),
    "model": pl.String(),
    "prompt_version": pl.String(),
    "backend": pl.String(),
    "seconds": pl.Float64(),
    "created_at": pl.Float64(),
}
_SHOWN_ROWS = 5  # bad rows named in the message


def write_records(out: Path, rows: list[tuple[str, Answer]]) -> None:
    """`out` (item_metadata.parquet), atomically: one row per (item id, its answer)."""
    records = [json.loads(a.record) if a.record else {} for _, a in rows]
    frame = pl.DataFrame({
        ITEM_ID: [item for item, _ in rows],
        "key": [a.key for _, a in rows],
        "status": [a.status for _, a in rows],
        **{field: [r.get(field) for r in records] for field in FIELDS},
        "problem": [a.problem for _, a in rows],
        "truncated": [a.truncated for _, a in rows],
        "attempts": [a.attempts for _, a in rows],
        "model": [a.model for _, a in rows],
        "prompt_version": [a.prompt_version for _, a in rows],
        "backend": [a.backend for _, a in rows],
        "seconds": [a.seconds for _, a in rows],
        "created_at": [a.created_at for _, a in rows],
    }, schema_overrides=SCHEMA)  # fmt: skip
    try:
        with atomic_file(out) as tmp:
            frame.write_parquet(tmp, compression="zstd")
    except OSError as err:
        raise DataError(out, f"cannot be written ({err.strerror or err})",
                        "make its directory writable (or free space) and run again: the answers are in the cache, "
                        "nothing is asked twice") from err  # fmt: skip


def read_answers(path: Path, categories: tuple[str, ...]) -> list[Answer]:
    """The answers an item_metadata.parquet holds (written by a run, here or on another machine), as the cache keeps
    them, each checked (module docstring; `categories`: the prompt's); DataError naming the bad columns or rows."""
    frame = _read_typed(path)
    answers, bad = [], []
    for number, row in enumerate(frame.iter_rows(named=True), start=1):
        record = {field: row[field] for field in FIELDS} if row["status"] == "ok" else None
        answer = Answer(
            key=row["key"], status=row["status"],
            record=None if record is None else json.dumps(record, ensure_ascii=False),
            problem=row["problem"], truncated=row["truncated"], attempts=row["attempts"], seconds=row["seconds"],
            model=row["model"], prompt_version=row["prompt_version"], backend=row["backend"],
            created_at=row["created_at"],
        )  # fmt: skip
        problem = answer_problem(answer, categories)
        if problem is None:
            answers.append(answer)
        else:
            bad.append(f"row {number} (item {row[ITEM_ID]!r}): {problem}")
    if bad:
        more = f"; and {len(bad) - _SHOWN_ROWS} more" if len(bad) > _SHOWN_ROWS else ""
        raise DataError(path, f"{len(bad)} of {frame.height} rows are not valid answers: "
                        f"{'; '.join(bad[:_SHOWN_ROWS])}{more}",
                        "correct or drop those rows (a file written by `recsys enrich` passes as it is); nothing was "
                        "taken from the file")  # fmt: skip
    return answers


def _read_typed(path: Path) -> pl.DataFrame:
    """The file's rows, after checking it is a parquet file with every column of `SCHEMA` in its type (a column of
    nulls alone may have none)."""
    try:
        frame = pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError) as err:
        raise DataError(path, f"not a readable parquet file ({type(err).__name__}: {str(err)[:200]})",
                        "give the item_metadata.parquet a `recsys enrich` run wrote") from err  # fmt: skip
    missing = sorted(set(SCHEMA) - set(frame.columns))
    if missing:
        raise DataError(path, f"no column {missing}: not a records file of this version",
                        "enrich again (the records of an older version cannot be reused)")  # fmt: skip
    wrong = [f"{name} is {frame.schema[name]}, not {dtype}" for name, dtype in SCHEMA.items()
             if frame.schema[name] not in (dtype, pl.Null())]  # fmt: skip
    if wrong:
        raise DataError(path, f"columns of another type: {'; '.join(wrong)}",
                        "write the columns in these types (a file written by `recsys enrich` has them); keywords and "
                        "queries are lists of strings")  # fmt: skip
    return frame
