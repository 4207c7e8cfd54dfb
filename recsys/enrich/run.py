"""Enrich a catalogue: every item with text gets a record (or a counted failure), through the cache, in batches.

`enrich_catalogue` asks the backend only for items the cache lacks (resumable, incremental), checks each answer
(`check_answer`), re-asks a refused one once where the backend is not constrained, caches every answer as it comes
(a batch per transaction), logs progress with the ETA, and writes `item_metadata.parquet` atomically
(`recsys.enrich.records`): one row per item the cache answers for, with its provenance (model, prompt version,
backend, attempts, why it failed).

A failure that is not the item's (`Generated.transient`: an outage, a server that answers something else) is not
cached: the item is left for the next run. A backend that cannot answer any more (`Backend.unavailable`) stops the run
after the batch under way, its answers cached, with `BackendUnavailable`. The speed is that of answering: a local
model's load is timed apart (`load_seconds`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from recsys.enrich.answer import MAX_PROBLEM_CHARS, Answer, answer_key
from recsys.enrich.backend import Backend, BackendUnavailable, Generated
from recsys.enrich.cache import EnrichCache
from recsys.enrich.record import AnswerError, Prompt, check_answer
from recsys.enrich.records import write_records
from recsys.runtime.progress import Progress

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnrichSummary:
    items: int  # items with text
    asked: int  # answered by the backend in this run
    cached: int  # answered by the cache
    ok: int
    failed: int
    left: int  # not answered: past `limit`, the token budget spent, or a transient failure (asked again next run)
    truncated: int  # records with a value cut at its token cap
    seconds: float  # of this run's backend calls (the answers alone)
    load_seconds: float  # of loading the backend's model (0 when nothing was asked)
    model: str
    prompt_version: str
    backend: str

    @property
    def valid_fraction(self) -> float:
        answered = self.ok + self.failed
        return self.ok / answered if answered else 0.0

    def record(self) -> dict[str, object]:
        return {**asdict(self), "valid_fraction": self.valid_fraction,
                "seconds_per_item": self.seconds / self.asked if self.asked else None,
                "items_per_second": self.asked / self.seconds if self.seconds else None}  # fmt: skip


def enrich_catalogue(
    item_ids: Sequence[str], texts: Sequence[str], backend: Backend, prompt: Prompt, cache: EnrichCache, out: Path,
    *, batch_size: int = 8, limit: int | None = None, retry_failed: bool = False,
) -> EnrichSummary:  # fmt: skip
    """Records for the items of `item_ids` with a non-empty text (in the order given: put cold items first to
    enrich them first), at most `limit` asked in this run; writes `out` (item_metadata.parquet)."""
    with_text = [(item, text) for item, text in zip(item_ids, texts, strict=True) if text.strip()]
    keys = [answer_key(text, prompt.version, backend.model) for _, text in with_text]
    known = cache.get(keys)
    todo = [i for i, key in enumerate(keys) if key not in known or (retry_failed and known[key].status == "failed")]
    left = max(0, len(todo) - limit) if limit is not None else 0
    todo = todo[: len(todo) - left]
    logger.info("enrich: %d items with text, %d in the cache, %d to ask %s (%s, prompt %s)", len(with_text),
                len(keys) - len(todo) - left, len(todo), backend.name, backend.model, prompt.version)  # fmt: skip
    load_seconds = _load(backend) if todo else 0.0
    progress = Progress(logger, "enrich", total=float(len(todo)), unit="items", rows_are="items")
    seconds, asked = 0.0, 0
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        began = time.perf_counter()
        answers = _ask(backend, prompt, [with_text[i][1] for i in batch], [keys[i] for i in batch])
        spent = time.perf_counter() - began
        answered = [a for a in answers if a is not None]
        cache.put(answered)
        known.update((a.key, a) for a in answered)
        left += len(answers) - len(answered)
        seconds, asked = seconds + spent, asked + len(answered)
        progress.update(done=float(start + len(batch)), rows=len(answered))
        if backend.unavailable is not None:
            raise BackendUnavailable(
                f"enrich stopped: {backend.unavailable}. The {asked} answers of this run are kept in the cache "
                f"{cache.path}. Fix: make it answer again (the last error says why it did not), then run the same "
                f"command again: it asks only for the {len(todo) - asked} items still missing"
            )
    progress.finish()
    rows = [(item, known[key]) for (item, _), key in zip(with_text, keys, strict=True) if key in known]
    write_records(out, rows)
    statuses = [answer.status for _, answer in rows]
    return EnrichSummary(
        items=len(with_text), asked=asked, cached=len(rows) - asked, ok=statuses.count("ok"),
        failed=statuses.count("failed"), left=left, truncated=sum(1 for _, a in rows if a.truncated),
        seconds=seconds, load_seconds=load_seconds, model=backend.model, prompt_version=prompt.version,
        backend=backend.name,
    )  # fmt: skip


def _load(backend: Backend) -> float:
    """Load the backend's model; the seconds it took."""
    began = time.perf_counter()
    backend.load()
    seconds = time.perf_counter() - began
    if seconds >= 0.1:
        logger.info("enrich: %s ready in %.1f s (not counted in the items/s)", backend.model, seconds)
    return seconds


def _ask(backend: Backend, prompt: Prompt, texts: list[str], keys: list[str]) -> list[Answer | None]:
    """Each text's answer (None: left for the next run, its failure transient); a refused one re-asked once if it may
    be."""
    began = time.perf_counter()
    first = backend.generate(texts, prompt)
    checked = [_check(g, prompt) for g in first]
    attempts = [1] * len(texts)
    again = [i for i, (_, problem) in enumerate(checked) if problem and not backend.constrained
             and not first[i].transient]  # fmt: skip
    if again:
        second = backend.generate([texts[i] for i in again], prompt, [checked[i][1] for i in again])
        for i, generated in zip(again, second, strict=True):
            checked[i], attempts[i], first[i] = _check(generated, prompt), 2, generated
    seconds = (time.perf_counter() - began) / len(texts)
    out: list[Answer | None] = []
    for key, generated, (record, problem), tries in zip(keys, first, checked, attempts, strict=True):
        if generated.transient:
            out.append(None)
            continue
        out.append(Answer(
            key=key, status="ok" if problem is None else "failed", record=record,
            problem=None if problem is None else problem[:MAX_PROBLEM_CHARS], truncated=",".join(generated.truncated),
            attempts=tries, seconds=seconds, model=backend.model, prompt_version=prompt.version, backend=backend.name,
            created_at=time.time(),
        ))  # fmt: skip
    return out


def _check(generated: Generated, prompt: Prompt) -> tuple[str | None, str | None]:
    """(the record as JSON, None) or (None, why there is none)."""
    if generated.text is None:
        return None, generated.error or "no answer"
    try:
        record = check_answer(generated.text, prompt.categories)
    except AnswerError as err:
        return None, str(err)
    return json.dumps(record.model_dump(mode="json"), ensure_ascii=False), None
