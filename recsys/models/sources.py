"""Candidate sources of the ranking stage: each proposes its top-N items for a user, the ranker re-scores their union.

Kinds (`CandidateSource.kind`), each named by its kind (one source per kind):

- `retriever`: the ranker's trained first stage (`model.upstream.retriever`): its top-N by score. It is required:
  its score of every candidate is the ranker's retrieval feature (and, with `residual`, the score it corrects).
- `content`: the items whose content embedding (the experiment's `content` section) is closest, by cosine, to one
  of the user's `recent` latest items: what a text nearest-neighbour retriever over the user's history proposes.
- `new_items`: the same content neighbours among the items no first stage was trained on (0 training interactions;
  for the training pairs, those the held-out twin never saw): new items reach the ranker, which learns when to
  show them, instead of a slot fixed by hand. They enter with the retriever score of its last candidate.

The union is de-duplicated and ordered by each item's best position in any source (a source's first item before
every source's second, ...), padded with item 0 to the widest row; every candidate carries, per source, 1 / (1 +
its position) in that source's top-N (0 where the source did not propose it) and, for the content kinds, its cosine
to the user's closest recent item (`Candidates.features`).

A source that raises is skipped for that call and logged (the retriever excepted: without its scores there is
nothing to rank); a `recsys.inference.SourceCall` records each source's time and failure, for serving's /metrics.

Dimension letters: B rows, L history length, N a source's top, C candidates (the union's width), S sources,
V+1 items (0 = padding), K content dim.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import PositiveInt

from recsys.inference import SourceCall

logger = logging.getLogger(__name__)

SourceKind = Literal["retriever", "content", "new_items"]
CONTENT_KINDS: tuple[SourceKind, ...] = ("content", "new_items")


@dataclass(frozen=True)
class CandidateSource:
    """One entry of the ranker's `model.params.sources`."""

    kind: SourceKind
    top: PositiveInt  # N: the items it proposes per user
    recent: PositiveInt = 5  # content kinds: the user's latest items whose content neighbours are proposed

    @property
    def name(self) -> str:
        return self.kind

    @property
    def reads_content(self) -> bool:
        return self.kind in CONTENT_KINDS


def check_sources(sources: Sequence[CandidateSource]) -> None:
    """ValueError unless the list names each kind at most once and the retriever among them."""
    kinds = [source.kind for source in sources]
    repeated = sorted({kind for kind in kinds if kinds.count(kind) > 1})
    if repeated:
        raise ValueError(f"sources: {repeated} named more than once; give each kind one entry")
    if "retriever" not in kinds:
        raise ValueError(
            f"sources {kinds}: the retriever is missing; its scores are the ranker's retrieval feature. Add "
            "{kind: retriever, top: 200}"
        )


def source_feature_count(sources: Sequence[CandidateSource]) -> int:
    """F: one position feature per source, plus a cosine per content kind."""
    return len(sources) + sum(source.reads_content for source in sources)


@dataclass(frozen=True)
class Candidates:
    """The union of the sources' proposals for a batch of rows.

    Args:
        items: (B, C) item_idx, best position first, 0 = padding (rows proposing fewer than C).
        retrieval: (B, C) the retriever's score of each candidate; an item no first stage was trained on gets the
            score of the retriever's last candidate (its own score is that of an untrained vector: it would sink
            the item whatever the other sources say); padding: the row's lowest real score.
        features: (B, C, F) per source 1 / (1 + position) in its top-N or 0, then the content kinds' cosines
            (`source_feature_count`); None for a ranker without `sources` (its retriever's top alone).
    """

    items: torch.Tensor
    retrieval: torch.Tensor
    features: torch.Tensor | None

    @property
    def real(self) -> torch.Tensor:
        """(B, C) bool: a candidate, not padding."""
        return self.items != 0


def recent_similarity(content: torch.Tensor, histories: torch.Tensor, recent: int) -> torch.Tensor:
    """(V+1, K) L2-normalised content (row 0 zero), (B, L) left-padded histories -> (B, V+1) each item's cosine to
    the closest of the user's `recent` latest items (0 for an empty history; padding -inf)."""
    latest = histories[:, -recent:]  # (B, R), padding rows of `content` are zero vectors
    cosine = torch.einsum("brk,vk->brv", content[latest], content)  # (B, R, V+1)
    real = (latest != 0)[..., None]
    best = cosine.masked_fill(~real, float("-inf")).amax(dim=1)
    best = torch.where(real.any(dim=1), best, torch.zeros_like(best))
    best[:, 0] = float("-inf")
    return best


def propose(
    sources: Sequence[CandidateSource],
    retriever_scores: torch.Tensor,
    similarity: Callable[[int], torch.Tensor] | None,
    untrained: torch.Tensor | None,
) -> tuple[Candidates, list[SourceCall]]:
    """The union of every source's top-N, with the features the ranker reads, and each source's call record.

    Args:
        sources: the ranker's sources, in its feature order.
        retriever_scores: (B, V+1) the retriever's scores (padding -inf).
        similarity: recent -> (B, V+1) `recent_similarity` of the rows (None: no content kind among `sources`).
        untrained: (V+1,) bool, the items no first stage was trained on (None: no new_items source).
    """
    B, V1 = retriever_scores.shape
    positions, cosines, calls = [], [], []
    for source in sources:
        start, failed = time.perf_counter(), False
        try:
            position, cosine = _proposal(source, retriever_scores, similarity, untrained)
        except Exception:
            if source.kind == "retriever":
                raise
            logger.exception("candidate source %s failed; ranking without it for this call", source.name)
            failed, position = True, torch.zeros(B, V1, device=retriever_scores.device)
            cosine = position if source.reads_content else None  # zeros: the feature says nothing
        calls.append(SourceCall(source.name, time.perf_counter() - start, failed))
        positions.append(position)
        if cosine is not None:
            cosines.append(cosine)
    best = torch.stack(positions).amax(dim=0)  # (B, V+1): the item's best position in any source, 0 = none
    best[:, 0] = 0.0
    width = int((best > 0).sum(dim=1).max().clamp(min=1))
    order = best.topk(width, dim=1)
    items = torch.where(order.values > 0, order.indices, torch.zeros_like(order.indices))
    retrieval = retriever_scores.gather(1, items)
    if untrained is not None:  # the retriever's score of an item it never trained on says nothing about the user
        retriever = next(source for source in sources if source.kind == "retriever")
        floor = retriever_scores.topk(min(retriever.top, V1 - 1), dim=1).values[:, -1:]  # its last candidate's
        retrieval = torch.where(untrained.to(items.device)[items], floor, retrieval)
    lowest = retrieval.masked_fill(items == 0, float("inf")).amin(dim=1, keepdim=True)
    retrieval = torch.where(items == 0, lowest, retrieval)
    features = torch.stack([p.gather(1, items) for p in positions] + [c.gather(1, items) for c in cosines], dim=-1)
    features = features.masked_fill(~features.isfinite(), 0.0) * (items != 0)[..., None]
    return Candidates(items, retrieval, features), calls


def _proposal(
    source: CandidateSource,
    retriever_scores: torch.Tensor,
    similarity: Callable[[int], torch.Tensor] | None,
    untrained: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, V+1) 1 / (1 + position) of the source's top-N items (0 elsewhere), and its cosines (content kinds)."""
    scores, cosine = retriever_scores, None
    if source.reads_content:
        if similarity is None:
            raise ValueError(f"source {source.name} reads content embeddings and the ranker has none")
        scores = cosine = similarity(source.recent)
    if source.kind == "new_items":
        if untrained is None:
            raise ValueError("source new_items needs the items no first stage was trained on")
        scores = scores.masked_fill(~untrained.to(scores.device)[None, :], float("-inf"))
    B, V1 = scores.shape
    top = scores.topk(min(source.top, V1 - 1), dim=1)
    weight = 1.0 / (1.0 + torch.arange(top.indices.shape[1], device=scores.device, dtype=torch.float32))
    position = torch.zeros(B, V1, device=scores.device)
    position.scatter_(1, top.indices, weight.expand(B, -1) * top.values.isfinite())  # -inf: not proposable
    return position, cosine
