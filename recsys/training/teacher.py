"""A teacher's top-K items per training target, for distillation (`recsys.training.recipes.distillation`): scored
once, in batches on the training device, saved in a directory and reused while its key (the teacher, the rows, K and
the history the teacher reads) is unchanged.

Every value of the trained rows (`NextItemRecipe.trained_rows`) but a row's first is a target; its history is the
row's values before it, the most recent `max_history` of them: what the student's packed batch feeds the student at
that target (`PackedBatch.target_index` says which value a target is). The teacher's scores of every item for that
history, the padding and the items no training softmax holds (cold-start items, other domains) masked, give its top K.
Items of the history are not masked: the evaluation protocol ranks them (nothing excluded) and the student's
cross-entropy keeps them in its softmax, so the teacher's mass on a repeat is part of what it knows.

The directory::

    items.npy    (P, K) int32, row j: the teacher's top K for the target at value j, best first; 0 = none
                 (a row's first value, or fewer than K items the teacher scores)
    scores.npy   (P, K) float32, their scores (-inf where the item is 0)
    meta.json    {"key": ..., "top_k": K, "positions": P}

Dimension letters: P values of the trained rows, T targets among them, K candidates per target, B targets a batch,
H the teacher's history window, V+1 items.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recsys.data.jagged import Jagged
from recsys.data.prepared import EvalSplit, TrainingRows
from recsys.errors import DataError, RecsysError
from recsys.evaluation.protocol import history_batches
from recsys.inference import Scorer, mask_unrankable, top_k
from recsys.runtime.atomic import atomic_directory
from recsys.runtime.json_files import read_json_object
from recsys.runtime.progress import Progress

logger = logging.getLogger(__name__)

ITEMS_FILE, SCORES_FILE, META_FILE = "items.npy", "scores.npy", "meta.json"
KEY_VERSION = 1  # bump when what a cache holds changes meaning: older caches are then recomputed


@dataclass(frozen=True)
class TeacherTopK:
    """The teacher's top K for every value of the trained rows (see the module's docstring)."""

    items: torch.Tensor  # (P, K) int32, 0 = no candidate
    scores: torch.Tensor  # (P, K) float32, -inf where items is 0
    key: str  # `teacher_key` of what it was computed from
    # copies on the devices the lookups came from (made on first use: one transfer per device, not one per step)
    _placed: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __len__(self) -> int:
        return len(self.items)

    @property
    def top_k(self) -> int:
        return self.items.shape[1]

    def at(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N,) value indices (`PackedBatch.target_index`) -> ((N, K) int64 items, (N, K) float32 scores), on the
        device of `index`."""
        if index.device not in self._placed:
            self._placed[index.device] = (self.items.to(index.device).long(), self.scores.to(index.device))
        items, scores = self._placed[index.device]
        return items[index], scores[index]

    def fingerprint(self, digest: Any) -> None:
        """Feed what the cache was computed from to `digest` (a hashlib one): a training run's inputs."""
        digest.update(self.key.encode())

    def save(self, directory: Path) -> None:
        """Write the cache to `directory`, replacing it atomically."""
        with atomic_directory(directory, marker=META_FILE) as tmp:
            np.save(tmp / ITEMS_FILE, self.items.numpy())
            np.save(tmp / SCORES_FILE, self.scores.numpy())
            meta = {"key": self.key, "top_k": self.top_k, "positions": len(self)}
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    @staticmethod
    def load(directory: Path, key: str) -> TeacherTopK | None:
        """The cache in `directory` when it was computed for `key`; None when there is none, it is another's or it
        does not read (a file cut short, not JSON/.npy, arrays of other shapes: logged, naming the file, and computed
        again, as a cache is)."""
        meta_path = directory / META_FILE
        if not meta_path.is_file():
            return None
        try:
            if read_json_object(meta_path, "none needed").get("key") != key:
                return None
            items, scores = (_read_array(directory / name) for name in (ITEMS_FILE, SCORES_FILE))
            if items.ndim != 2 or items.shape != scores.shape or items.dtype != np.int32 or scores.dtype != np.float32:
                raise DataError(directory, f"items {items.dtype} {items.shape} and scores {scores.dtype} "
                                f"{scores.shape} are not (P, K) int32 and float32", "none needed")  # fmt: skip
        except DataError as err:
            logger.warning("teacher cache %s: %s: computed again", err.path, err.problem)
            return None
        return TeacherTopK(torch.from_numpy(items), torch.from_numpy(scores), key)


def _read_array(path: Path) -> np.ndarray:
    try:
        array: np.ndarray = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:  # missing, cut short, not an .npy, pickles
        raise DataError(path, f"not a readable .npy array ({type(err).__name__}: {str(err)[:200]})", "none") from err
    return array


def teacher_key(teacher_sha256: str, rows: TrainingRows, candidates: torch.Tensor, top_k: int, max_history: int) -> str:
    """The key of a cache: the teacher's weights (their SHA-256), the trained rows (items and times), the items that
    may be candidates, K and the teacher's history window."""
    digest = hashlib.sha256(f"v{KEY_VERSION}|{teacher_sha256}|{top_k}|{max_history}|".encode())
    for tensor in (rows.items.values, rows.items.offsets, rows.timestamps.values, candidates):
        digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def cached_teacher_topk(
    directory: Path, teacher: Scorer, rows: TrainingRows, user_idx: torch.Tensor, settings: TeacherScoring
) -> TeacherTopK:
    """The cache of `directory` when its key is `settings.key`, else the teacher's top K computed and saved there."""
    cached = TeacherTopK.load(directory, settings.key)
    if cached is not None:
        logger.info("teacher top-%d: reusing %s", settings.top_k, directory)
        return cached
    computed = teacher_topk(teacher, rows, user_idx, settings)
    computed.save(directory)
    logger.info("teacher top-%d of %d targets written to %s", settings.top_k, int((computed.items[:, 0] > 0).sum()),
                directory)  # fmt: skip
    return computed


@dataclass(frozen=True)
class TeacherScoring:
    """How the teacher's top K are computed."""

    key: str  # `teacher_key` of the teacher, rows and settings
    top_k: int
    candidates: torch.Tensor  # (V+1,) bool, the items that may be among them (the training softmax's)
    batch_size: int = 512  # targets scored at once


@torch.no_grad()
def teacher_topk(teacher: Scorer, rows: TrainingRows, user_idx: torch.Tensor, settings: TeacherScoring) -> TeacherTopK:
    """Score every target of `rows` (their users: (U,) `user_idx`) with `teacher` and keep its top K.

    Raises:
        RecsysError: the teacher scores no item at all for some history (nothing to distil there).
    """
    where, split = _targets(rows, user_idx, teacher.max_history, settings.candidates)
    k = settings.top_k
    items = torch.zeros(len(rows.items.values), k, dtype=torch.int32)
    scores = torch.full((len(rows.items.values), k), float("-inf"))
    progress = Progress(logger, f"teacher top-{k}", total=len(where), unit="targets", rows_are="targets")
    for batch, histories, width in history_batches(split, teacher.max_history, settings.batch_size):
        all_scores = teacher.score(histories.to_padded(width), split.user_idx[batch], split.times(batch, width))
        best, columns = top_k(mask_unrankable(all_scores.float(), None, candidates=split.candidates), k)  # (B, k)
        known = best.isfinite()
        if not bool(known[:, 0].all()):
            raise RecsysError(
                f"the teacher ({type(teacher).__name__}) scores no item for {int((~known[:, 0]).sum())} training "
                "histories. Fix: use a teacher that scores every history (a retriever, or a ranker over its "
                "first stage's candidates)"
            )
        items[where[batch], : columns.shape[1]] = torch.where(known, columns, 0).int().cpu()
        scores[where[batch], : best.shape[1]] = best.cpu()
        progress.update(done=progress.rows + len(batch), rows=len(batch))
    progress.finish()
    return TeacherTopK(items, scores, settings.key)


def _targets(
    rows: TrainingRows, user_idx: torch.Tensor, max_history: int, candidates: torch.Tensor
) -> tuple[torch.Tensor, EvalSplit]:
    """The (T,) value indices of the targets of `rows` and, as an evaluation split (one row per target), their
    histories (the last `max_history` values before each in its row), times and users."""
    values, offsets = rows.items.values, rows.items.offsets
    row_of = torch.repeat_interleave(torch.arange(len(rows.items)), rows.items.lengths())  # (P,)
    start = offsets[:-1][row_of]  # (P,) the first value of each value's row
    where = torch.nonzero(torch.arange(len(values)) > start).squeeze(1)  # (T,)
    first = torch.maximum(start[where], where - max_history)  # (T,) each history's first value
    lengths = where - first
    within = torch.arange(int(lengths.sum())) - torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
    gather = torch.repeat_interleave(first, lengths) + within  # (sum of lengths,) the histories' values
    times = rows.timestamps.values
    split = EvalSplit(
        histories=Jagged.from_lengths(values[gather], lengths),
        targets=values[where],
        user_idx=user_idx[row_of[where]],
        timestamps=Jagged.from_lengths(times[gather], lengths),
        request_times=times[where],
        candidates=candidates,
    )
    return where, split
