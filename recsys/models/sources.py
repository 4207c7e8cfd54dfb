"""Candidate sources of the ranking stage: each proposes its top-N items for a user, the ranker re-scores their union.

Kinds (`CandidateSource.kind`), each named by its kind (one source per kind):

- `retriever`: the ranker's trained first stage (`model.upstream.retriever`): its top-N by score. It is required:
  its score of every candidate is the ranker's retrieval feature (and, with `residual`, the score it corrects).
- `content`: the items whose content embedding (the experiment's `content` section) is closest, by cosine, to one
  of the user's `recent` latest items: what a text nearest-neighbour retriever over the user's history proposes.
- `model`: a further trained first stage (HSTU, the generative retriever, the two-tower, ...), the `index`-th of
  `model.upstream.extra_retrievers` (its held-out twin the same entry of `extra_holdout_retrievers`): its top-N, and
  for each candidate its score's gap to its row's best (0 where it did not propose the item).
- `new_items`: the same content neighbours among the items no first stage was trained on (0 training interactions;
  for the training pairs, those the held-out twin never saw): new items reach the ranker, which learns when to
  show them, instead of a slot fixed by hand. They enter with the retriever score of its last candidate.

The union is de-duplicated and ordered by each item's best position in any source (a source's first item before
every source's second, ...; equal positions: the lower item_idx first), padded with item 0 to the widest row; every
candidate carries, per source, 1 / (1 + its position) in that source's top-N (0 where the source did not propose it),
then for the content kinds its cosine to the user's closest recent item and for the model kind its score gap
(`Candidates.features`).

What a call costs (a serving request, a training batch): the content kind reads each recent item's N nearest
items from a table made once per content (`content_neighbours`: V^2 * K multiply-adds, then (V+1) * N entries kept),
exact on its top N; the new_items kind takes the cosines to the untrained items alone (U * R * K per row); the
cosine feature is computed for the union's candidates only (C * R * K). An empty history gets no content proposals.

A source that raises is skipped for that call and logged (the retriever excepted: without its scores there is
nothing to rank); a `SourceCall` records each source's time and failure, for serving's /metrics.

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
import torch.nn.functional as F
from pydantic import NonNegativeInt, PositiveInt

from recsys.ordering import best_first

logger = logging.getLogger(__name__)

SourceKind = Literal["retriever", "model", "content", "new_items"]
CONTENT_KINDS: tuple[SourceKind, ...] = ("content", "new_items")


@dataclass(frozen=True)
class CandidateSource:
    """One entry of the ranker's `model.params.sources`."""

    kind: SourceKind
    top: PositiveInt  # N: the items it proposes per user
    recent: PositiveInt = 5  # content kinds: the user's latest items whose content neighbours are proposed
    index: NonNegativeInt = 0  # model kind: which of model.upstream.extra_retrievers
    label: str | None = None  # how logs and /metrics name it; default: the kind (model: "model<index>")

    @property
    def name(self) -> str:
        if self.label is not None:
            return self.label
        return f"model{self.index}" if self.kind == "model" else self.kind

    @property
    def reads_content(self) -> bool:
        return self.kind in CONTENT_KINDS

    @property
    def features(self) -> int:
        """Its features per candidate: its position, and a content kind's cosine or a model's score gap."""
        return 2 if self.reads_content or self.kind == "model" else 1


def check_sources(sources: Sequence[CandidateSource], extra_retrievers: int | None = None) -> None:
    """ValueError unless the names are unique, the retriever is listed once, each model source names one of
    `extra_retrievers` (when known) and no extra retriever is left unused."""
    names = [source.name for source in sources]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"sources: {repeated} named more than once; give each source a kind or label of its own")
    if [source.kind for source in sources].count("retriever") != 1:
        raise ValueError(
            f"sources {names}: list the retriever once; its scores are the ranker's retrieval feature. Add "
            "{kind: retriever, top: 200}"
        )
    if extra_retrievers is None:
        return
    indices = sorted(source.index for source in sources if source.kind == "model")
    if indices != list(range(extra_retrievers)):
        raise ValueError(
            f"sources: the model sources name extra retrievers {indices}, and model.upstream.extra_retrievers has "
            f"{extra_retrievers}; give each of them one {{kind: model, index: i}} (i from 0)"
        )


def source_feature_count(sources: Sequence[CandidateSource]) -> int:
    """F: each source's `features`."""
    return sum(source.features for source in sources)


@dataclass(frozen=True)
class SourceCall:
    """One candidate source's part of one call: how long it took, and whether it failed (and was skipped)."""

    source: str
    seconds: float
    failed: bool


@dataclass(frozen=True)
class Candidates:
    """The union of the sources' proposals for a batch of rows.

    Args:
        items: (B, C) item_idx, best position in any source first (ties: the lower item_idx), 0 = padding (rows
            proposing fewer than C).
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


def gather_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """`table[index]` for a (N, K) float table and an index of any shape -> (*index.shape, K): the same rows, copied
    a row at a time (index_select) rather than element by element as advanced indexing does on a CPU, where a
    served ranker call gathers its ~C candidates' content rows several times."""
    return F.embedding(index, table)


def untrained_items(counts: torch.Tensor) -> torch.Tensor:
    """(V+1,) training interactions per item -> (V+1,) bool: the items no first stage saw (never the padding)."""
    untrained = counts == 0
    untrained[0] = False
    return untrained


@dataclass(frozen=True)
class ContentNeighbours:
    """Every item's `top` nearest items by content cosine, itself among them (`content_neighbours`)."""

    cosines: torch.Tensor  # (V+1, N) closest first; row 0 (the padding) all -inf
    items: torch.Tensor  # (V+1, N) item_idx


BLOCK_COSINES = 2**25  # cosines per block of `content_neighbours` (128 MiB in fp32), whatever the catalogue's size


def content_neighbours(content: torch.Tensor, top: int, block_rows: int | None = None) -> ContentNeighbours:
    """(V+1, K) L2-normalised content (row 0 zero) -> each item's `top` nearest items (never the padding): V^2 * K
    multiply-adds once, in blocks of `block_rows` rows (default: BLOCK_COSINES cosines a block), so that a user's
    content neighbours cost R * N per call (`neighbour_scores`) instead of R * V * K."""
    V1 = content.shape[0]
    n = min(top, V1 - 1)
    block_rows = block_rows or max(1, BLOCK_COSINES // V1)
    cosines, items = [], []
    with torch.autocast(content.device.type, enabled=False):  # fp32: bf16 cosines would tie close neighbours
        content = content.float()
        for start in range(0, V1, block_rows):
            block = content[start : start + block_rows] @ content.T  # (b, V+1)
            block[:, 0] = float("-inf")
            found = block.topk(n, dim=1)
            cosines.append(found.values)
            items.append(found.indices)
    neighbours = ContentNeighbours(torch.cat(cosines), torch.cat(items))
    neighbours.cosines[0] = float("-inf")  # the padding of a history has no neighbours
    return neighbours


def neighbour_scores(neighbours: ContentNeighbours, histories: torch.Tensor, recent: int) -> torch.Tensor:
    """(B, L) left-padded histories -> (B, V+1) the `content` source's scores: an item's cosine to the closest of the
    user's `recent` latest items among whose neighbours it is, -inf elsewhere (and for an empty history).

    On the top N (N <= the neighbours' width) this is exactly each item's cosine to its closest recent item: an item
    in that top N is among the N nearest of its closest recent item, else N items would score above it."""
    B, V1 = histories.shape[0], neighbours.items.shape[0]
    latest = histories[:, -recent:]  # (B, R); the padding's row proposes nothing
    scores = torch.full((B, V1), float("-inf"), device=histories.device)
    scores.scatter_reduce_(1, neighbours.items[latest].flatten(1), neighbours.cosines[latest].flatten(1), "amax")
    scores[:, 0] = float("-inf")
    return scores


def recent_cosine(content: torch.Tensor, histories: torch.Tensor, recent: int, items: torch.Tensor) -> torch.Tensor:
    """(V+1, K) L2-normalised content, (B, L) left-padded histories, items (B, C) or (C,) for every row -> (B, C)
    each item's cosine to the closest of the user's `recent` latest items (0 for an empty history)."""
    latest = histories[:, -recent:]  # (B, R)
    pattern = "ck,brk->bcr" if items.dim() == 1 else "bck,brk->bcr"
    with torch.autocast(content.device.type, enabled=False):  # fp32, as the neighbour table's cosines
        cosine = torch.einsum(pattern, gather_rows(content, items).float(), gather_rows(content, latest).float())
    real = (latest != 0)[:, None, :]
    best = cosine.masked_fill(~real, float("-inf")).amax(dim=2)
    return torch.where(real.any(dim=2), best, torch.zeros_like(best))


def untrained_scores(
    content: torch.Tensor, histories: torch.Tensor, recent: int, untrained: torch.Tensor
) -> torch.Tensor:
    """(B, L) left-padded histories, (V+1,) bool the untrained items -> (B, V+1) the `new_items` source's scores:
    each untrained item's cosine to the closest of the user's `recent` latest items (U * R * K per user, U
    untrained items), -inf for the trained items and for an empty history."""
    columns = untrained.to(histories.device).nonzero().squeeze(1)  # (U,)
    cosine = recent_cosine(content, histories, recent, columns)  # (B, U)
    cosine = cosine.masked_fill((histories[:, -recent:] == 0).all(dim=1, keepdim=True), float("-inf"))
    scores = torch.full((histories.shape[0], content.shape[0]), float("-inf"), device=histories.device)
    return scores.index_copy_(1, columns, cosine)


def propose(
    sources: Sequence[CandidateSource],
    score: Callable[[CandidateSource], torch.Tensor],
    cosine: Callable[[CandidateSource, torch.Tensor], torch.Tensor],
    untrained: torch.Tensor | None,
) -> tuple[Candidates, list[SourceCall]]:
    """The union of every source's top-N, with the features the ranker reads, and each source's call record.

    Args:
        sources: the ranker's sources, in its feature order.
        score: a source -> (B, V+1) its scores of every item, -inf for the padding and what it cannot propose (a
            content kind: at least its top-N exact, `neighbour_scores`, `untrained_scores`); timed as the source's
            call.
        cosine: a content kind, (B, C) the union's items -> (B, C) each one's cosine to the user's closest recent
            item (`recent_cosine`), its second feature; timed as part of the source's call.
        untrained: (V+1,) bool, the items no first stage was trained on (None: no new_items source); the trained
            first stages (retriever, model kinds) do not propose them (their scores come from untrained vectors):
            only the content kinds do.
    """
    retriever = next(source for source in sources if source.kind == "retriever")
    if untrained is not None:
        score = _untrained_unproposed(score, untrained)
    start = time.perf_counter()
    retriever_scores = score(retriever)  # first, whatever its place: the others need its shape, it cannot fail
    B, V1 = retriever_scores.shape
    tops: dict[str, Top] = {}
    seconds: dict[str, float] = {}
    failed: set[str] = set()
    for source in sources:
        if source is not retriever:
            start = time.perf_counter()
        try:
            tops[source.name] = _top(source, retriever_scores if source is retriever else score(source))
        except Exception:
            if source is retriever:
                raise
            _skip(source, failed)
            tops[source.name] = Top.empty(B, retriever_scores.device)
        seconds[source.name] = time.perf_counter() - start
    items = _union(list(tops.values()), V1)
    scratch = torch.zeros(B, V1, device=items.device)  # one (B, V+1) row buffer for every source's lookups
    retrieval = retriever_scores.gather(1, items)
    if untrained is not None:  # the retriever's score of an item it never trained on says nothing about the user
        retrieved = tops[retriever.name]
        floor = retrieved.values.masked_fill(retrieved.weights == 0, float("inf")).amin(dim=1, keepdim=True)
        retrieval = torch.where(untrained.to(items.device)[items], floor, retrieval)  # its last candidate's score
    lowest = retrieval.masked_fill(items == 0, float("inf")).amin(dim=1, keepdim=True)
    retrieval = torch.where(items == 0, lowest, retrieval)
    extras = []  # per source of two features, its second, (B, C)
    for source in sources:
        if source.features == 1:
            continue
        start = time.perf_counter()
        extra = torch.zeros(items.shape, device=items.device)
        if source.kind == "model":
            extra = tops[source.name].gap(items, scratch)
        elif source.reads_content and source.name not in failed:
            try:
                extra = cosine(source, items)
                if source.kind == "new_items":  # its cosine where it could propose the item: an untrained one
                    assert untrained is not None
                    extra = extra * untrained.to(items.device)[items]
            except Exception:
                _skip(source, failed)  # its proposals stay in the union, with no cosine
        extras.append(extra)
        seconds[source.name] += time.perf_counter() - start
    positions = [tops[source.name].position(items, scratch) for source in sources]
    features = torch.stack(positions + extras, dim=-1)
    features = features.masked_fill(~features.isfinite(), 0.0) * (items != 0)[..., None]
    calls = [SourceCall(source.name, seconds[source.name], source.name in failed) for source in sources]
    return Candidates(items, retrieval, features), calls


@dataclass(frozen=True)
class Top:
    """One source's top-N of a batch: (B, N) items, their scores and weights 1 / (1 + position), 0 where the score is
    -inf (not proposable: not proposed)."""

    indices: torch.Tensor
    values: torch.Tensor
    weights: torch.Tensor

    @staticmethod
    def empty(rows: int, device: torch.device) -> Top:
        """What a failed source proposes: nothing."""
        none = torch.zeros(rows, 0, device=device)
        return Top(none.long(), none, none)

    def lookup(self, per_item: torch.Tensor, items: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
        """(B, N) values of this top's items -> (B, C) those of `items`, 0 for an item not in it: scattered into the
        zeroed (B, V+1) `scratch` and read back, which is left zeroed again."""
        found = scratch.scatter_(1, self.indices, per_item).gather(1, items)
        scratch.scatter_(1, self.indices, torch.zeros_like(per_item))
        return found

    def position(self, items: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
        """(B, C) 1 / (1 + position) of each of `items` in this top, 0 for an item not in it."""
        return self.lookup(self.weights, items, scratch)

    def gap(self, items: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
        """A model source's second feature: (B, C) each of `items` it proposed, its score's gap to its row's best
        (its top-1), 0 elsewhere."""
        proposed = self.weights > 0
        gap = torch.where(proposed, self.values - self.values[:, :1], torch.zeros_like(self.values))
        return self.lookup(gap, items, scratch)


def _top(source: CandidateSource, scores: torch.Tensor) -> Top:
    """The source's top-N of (B, V+1) scores."""
    B, V1 = scores.shape
    top = scores.topk(min(source.top, V1 - 1), dim=1)
    weight = 1.0 / (1.0 + torch.arange(top.indices.shape[1], device=scores.device, dtype=torch.float32))
    return Top(top.indices, top.values, weight.expand(B, -1) * top.values.isfinite())


def _union(tops: list[Top], num_columns: int) -> torch.Tensor:
    """(B, C) the items some source proposed, each once, by their best position in any source (ties: the lower
    item_idx first), then 0 (rows proposing fewer than C, the widest row's count). Works on the (B, sum N) proposals:
    no (B, V+1) sort."""
    proposals = torch.cat([top.indices for top in tops], dim=1)  # (B, M)
    weights = torch.cat([top.weights for top in tops], dim=1) * (proposals != 0)  # the padding is never proposed
    per_item = torch.zeros(proposals.shape[0], num_columns, device=proposals.device)
    per_item.scatter_reduce_(1, proposals, weights, "amax")  # each item's best weight in any source
    by_item = proposals.sort(dim=1).values
    best = per_item.gather(1, by_item)  # (B, M) the best weight of each proposal's item, proposals by item
    first = torch.ones_like(by_item, dtype=torch.bool)
    first[:, 1:] = by_item[:, 1:] != by_item[:, :-1]
    keep = first & (best > 0)
    width = int(keep.sum(dim=1).max().clamp(min=1)) if keep.numel() else 1
    ranked, items = best_first(best.masked_fill(~keep, -1.0), by_item, width)
    items = torch.where(ranked > 0, items, torch.zeros_like(items))
    return F.pad(items, (0, width - items.shape[1]))  # no proposals at all (an empty catalogue): one 0 a row


def _untrained_unproposed(
    score: Callable[[CandidateSource], torch.Tensor], untrained: torch.Tensor
) -> Callable[[CandidateSource], torch.Tensor]:
    """`score`, with the trained first stages' scores of the untrained items -inf."""

    def scored(source: CandidateSource) -> torch.Tensor:
        scores = score(source)
        if source.kind not in ("retriever", "model"):
            return scores
        return scores.masked_fill(untrained.to(scores.device)[None], float("-inf"))

    return scored


def _skip(source: CandidateSource, failed: set[str]) -> None:
    logger.exception("candidate source %s failed; ranking without it for this call", source.name)
    failed.add(source.name)
