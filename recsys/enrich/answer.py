"""One item's answer as the cache keeps it, and the check an answer passes wherever it comes from outside this run:
a records file made elsewhere (`recsys.enrich.records`) before it enters the cache, a cache row (written by an
older version, or by hand) before it is used.

Example:
    >>> answer = Answer(key=answer_key("Lip Balm", "item-metadata-v1", "m@1"), status="failed", record=None,
    ...                 problem="not JSON", truncated="", attempts=0, seconds=0.5, model="m@1",
    ...                 prompt_version="item-metadata-v1", backend="http", created_at=1.7e9)
    >>> answer_problem(answer)
    'attempts: 0 is not a whole number >= 1'
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

from recsys.enrich.record import record_problem

STATUSES = ("ok", "failed")
MAX_PROBLEM_CHARS = 2_000  # of a failure's reason (a run writes it clipped there)
MAX_NAME_CHARS = 1_000  # of the model, prompt version, backend and truncated fields
_KEY = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Answer:
    """One item's answer, as cached."""

    key: str
    status: str  # ok | failed
    record: str | None  # the record as JSON (status ok)
    problem: str | None  # why it is not a record (status failed)
    truncated: str  # fields cut at their token cap, comma-separated
    attempts: int
    seconds: float  # of its batch, shared by its rows
    model: str
    prompt_version: str
    backend: str
    created_at: float  # unix seconds


def answer_key(text: str, prompt_version: str, model: str) -> str:
    return hashlib.sha256("\x1f".join((text, prompt_version, model)).encode()).hexdigest()


def answer_problem(answer: Answer, categories: tuple[str, ...] | None = None) -> str | None:
    """Why `answer` cannot be used (its first problem, naming the field), or None; with `categories`, an ok record's
    category must be one of them."""
    if not (isinstance(answer.key, str) and _KEY.fullmatch(answer.key)):
        return f"key: {_shown(answer.key)} is not a sha256 in hex (64 characters)"
    if answer.status not in STATUSES:
        return f"status: {_shown(answer.status)} is not one of {', '.join(STATUSES)}"
    if answer.status == "ok" and (problem := record_problem(answer.record, categories)) is not None:
        return f"record: {problem}"
    if answer.status == "failed" and not _text(answer.problem, MAX_PROBLEM_CHARS, empty=False):
        return f"problem: a failed answer needs its reason, a text of at most {MAX_PROBLEM_CHARS:,} characters"
    for field in ("model", "prompt_version", "backend", "truncated"):
        if not _text(getattr(answer, field), MAX_NAME_CHARS, empty=field == "truncated"):
            return f"{field}: {_shown(getattr(answer, field))} is not a text of 1 to {MAX_NAME_CHARS:,} characters"
    if not (_is_number(answer.attempts, whole=True) and answer.attempts >= 1):
        return f"attempts: {_shown(answer.attempts)} is not a whole number >= 1"
    for field in ("seconds", "created_at"):
        if not (_is_number(getattr(answer, field)) and 0 <= getattr(answer, field) < math.inf):
            return f"{field}: {_shown(getattr(answer, field))} is not a number >= 0"
    return None


def _text(value: object, limit: int, *, empty: bool) -> bool:
    return isinstance(value, str) and (empty or bool(value)) and len(value) <= limit


def _is_number(value: object, *, whole: bool = False) -> bool:
    kinds = (int,) if whole else (int, float)
    return isinstance(value, kinds) and not isinstance(value, bool)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
