"""Second stage: a ranker that re-scores a retriever's top-C candidates, and the two stages as one scorer.

`Ranker` scores (history, candidate) pairs: the candidate's embedding queries the history by attention
(target attention: what in this history speaks for this candidate), then cross features of the candidate,
that user interest, the last item and the retriever's score (as the gap to the row's best) go through a head: a dense
MLP or a mixture-of-experts (`recsys.modules.moe`), one output per task: task 0 ranks, the others predict the
labels of the user's interaction with the candidate that the data has (`recsys.data.tasks`, e.g. whether it is a
purchase, its rating), from the same features (multi-task: MMoE-style gates with the MoE head). Options:
`residual` adds the head's output to the retriever's score (the head starts at zero, so training starts from the
first stage's order and learns a correction); `freeze_item_embeddings` keeps the item vectors copied from the
retriever; `use_content` adds the items' content (LLM) embeddings: projected into every item vector, and as the
candidate's cosine similarity to the last item and to the closest and average history item; `use_categories` adds
the items' category levels (`recsys.data.categories`, the data's `data.attributes.categories`): one embedding per
level's value, summed into every item vector (candidate and history alike); `category_tasks` predicts the next
item's category at each level (tasks `category_l1`..`category_l<k>`, multi-class) through the same head, from the
user side alone: the features of a pseudo-candidate that is the user's last item (no retriever score), so nothing
of the candidates (the target among them in training) leaks in.

`TwoStageRanker` holds a frozen retriever and a `Ranker`. Its `score` is the platform's `Scorer`: the
retriever's top-C items get the ranker's scores and every other item -inf, so the standard evaluation
counts a target the retriever missed as a miss; `task_predictions` gives the other tasks' predictions for given items.
Only the ranker trains (`recsys.training.recipes.ranker`: softmax over the candidates where the retriever found the
target, hard negatives = the retriever's own top-C, plus each task's loss on the target).

Dimension letters: B rows, L history length, C candidates, D dim, V+1 items (0 = padding), T tasks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol, cast, runtime_checkable

import torch
import torch.nn.functional as F
from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt
from torch import nn

from recsys.data.categories import MAX_CATEGORY_LEVELS, CategoryTable, category_task_names
from recsys.data.tasks import Task, task_kind
from recsys.data.times import HistoryTimes
from recsys.errors import ConfigError
from recsys.models.family import (
    DEFAULT_MAX_HISTORY,
    Input,
    Model,
    ModelFamily,
    ModelInputs,
    Rebuild,
    UpstreamRole,
    check_items,
    content_of,
    required,
)
from recsys.models.sources import (
    Candidates,
    CandidateSource,
    ContentNeighbours,
    SourceCall,
    check_sources,
    content_neighbours,
    gather_rows,
    neighbour_scores,
    propose,
    recent_cosine,
    source_feature_count,
    untrained_items,
    untrained_scores,
)
from recsys.modules.inference_cache import InferenceCache
from recsys.modules.moe import MoEConfig, MoELayer
from recsys.runtime.validation import Fraction, check_heads

CONTENT_SIMILARITIES = ("last", "closest", "average")


@dataclass(frozen=True)
class RankerConfig:
    num_items: int
    retriever: dict[str, Any] = field(default_factory=dict)  # {"name", "config"} of the frozen first stage
    # the same of each further first stage (model.upstream.extra_retrievers: the sources of kind model)
    extra_retrievers: tuple[dict[str, Any], ...] = ()
    num_candidates: PositiveInt = 200  # C: the retriever's top-C are re-scored
    max_history: PositiveInt = DEFAULT_MAX_HISTORY
    dim: PositiveInt = 64
    num_heads: PositiveInt = 2
    hidden: PositiveInt = 256  # the head's hidden size (dense) or each expert's (moe)
    head: Literal["dense", "moe"] = "dense"
    num_experts: PositiveInt = 8  # moe only
    top_k: PositiveInt = 2  # moe only
    balancing: Literal["bias", "aux_loss", "none"] = "bias"  # moe only: how the experts are kept evenly used
    bias_update_rate: NonNegativeFloat = 1e-3  # moe with "bias" balancing: the per-expert bias step after each batch
    # the tasks predicted beside ranking (`recsys.data.tasks` names); None = every task the data has (filled when
    # the model is built), () = ranking only
    tasks: tuple[str, ...] | None = None
    dropout: Fraction = 0.1
    residual: bool = False  # task 0 = retriever score + the head's correction (which starts at zero)
    freeze_item_embeddings: bool = False  # keep the item vectors copied from a SASRec retriever when it is built
    use_content: bool = False  # read content embeddings (the experiment's `content` section)
    content_dim: NonNegativeInt = 0  # filled from the content embeddings when `use_content`
    use_categories: bool = False  # the items' category levels enter the item vectors (data.attributes.categories)
    category_tasks: bool = False  # predict the next item's category at each level (tasks category_l1..)
    category_levels: Annotated[int, Field(ge=1, le=MAX_CATEGORY_LEVELS)] = 3  # the top levels read and predicted
    # filled from the data when either option is on: n_k, the values of each level read (at most category_levels;
    # fewer when the data's paths are shallower)
    category_sizes: tuple[int, ...] = ()
    # where the candidates come from (recsys.models.sources): the union of each source's top-N, every candidate with
    # its position in each; () = the retriever's top `num_candidates` alone, with no per-source features
    sources: tuple[CandidateSource, ...] = ()
    # added to the logit of every new candidate (one no first stage was trained on) when scoring, never in training:
    # how far new items are lifted past the trained ones; chosen on validation (benchmarks.new_item_prior's
    # "reference" rule, docs/ranking.md). Needs a new_items source.
    new_item_prior: NonNegativeFloat = 0.0

    def __post_init__(self) -> None:
        check_heads(self.num_heads, self.dim)
        if self.sources:
            check_sources(self.sources)
        if self.new_item_prior and not self.proposes_new_items:
            raise ValueError(
                f"new_item_prior: {self.new_item_prior} lifts the new items among the candidates, and no source "
                "proposes them; add {kind: new_items, top: 20} to sources, or leave new_item_prior at 0"
            )
        if self.reads_source_content and not self.use_content:
            raise ValueError(
                "sources content / new_items find neighbours by the items' content embeddings, which the ranker reads "
                "only with use_content: true; set it, or drop those sources"
            )
        if self.head == "moe" and self.top_k > self.num_experts:
            raise ValueError(f"top_k: {self.top_k} experts per example is more than num_experts ({self.num_experts})")

    @property
    def num_tasks(self) -> int:
        """Ranking and the other tasks: the head's outputs per candidate."""
        return 1 + len(self.tasks or ())

    @property
    def category_task_names(self) -> tuple[str, ...]:
        """The category tasks, category_l1 .. (none without `category_tasks`)."""
        return category_task_names(len(self.category_sizes)) if self.category_tasks else ()

    @property
    def source_features(self) -> int:
        """The per-source features of each candidate (`recsys.models.sources.Candidates.features`)."""
        return source_feature_count(self.sources)

    @property
    def reads_source_content(self) -> bool:
        return any(source.reads_content for source in self.sources)

    @property
    def proposes_new_items(self) -> bool:
        return any(source.kind == "new_items" for source in self.sources)


class Ranker(nn.Module):
    def __init__(
        self, config: RankerConfig, content: torch.Tensor | None = None, categories: torch.Tensor | None = None
    ) -> None:
        """Args: config; content (V+1, content_dim) item content embeddings when `content_dim` > 0 (row 0: the
        padding; None: from a state dict); categories (V+1, K) int64 category-level ids when `category_sizes` is
        set (K levels, 0 = none; None: from a state dict)."""
        super().__init__()
        self.config = config
        d = config.dim
        self.item_emb = nn.Embedding(config.num_items + 1, d, padding_idx=0)
        self.item_emb.weight.requires_grad_(not config.freeze_item_embeddings)
        self.pos_emb = nn.Embedding(config.max_history, d)
        self.attention = nn.MultiheadAttention(d, config.num_heads, dropout=config.dropout, batch_first=True)
        # candidate, interest, candidate * interest, candidate * last item, retriever gap (+ 3 content similarities)
        # (+ the per-source features)
        features = 4 * d + 1 + (len(CONTENT_SIMILARITIES) if config.content_dim else 0) + config.source_features
        self.content_proj = nn.Linear(config.content_dim, d) if config.content_dim else None
        if config.content_dim:  # normalised once: the similarities are cosines
            content = torch.zeros(config.num_items + 1, config.content_dim) if content is None else content
            content = F.normalize(content.float(), dim=-1)
        self.content: torch.Tensor | None
        self.register_buffer("content", content if config.content_dim else None)
        sizes = config.category_sizes
        if sizes and categories is None:
            categories = torch.zeros(config.num_items + 1, len(sizes), dtype=torch.int64)
        self.categories: torch.Tensor | None
        self.register_buffer("categories", categories if sizes else None)  # travels in the state dict, like content
        # one embedding per level, summed into the item vector rather than concatenated: the item stays one D-vector
        # that the attention, the cross products and a retriever-tied item table all read unchanged; zero at the
        # start, so the ranker starts from the item vectors it has and learns what the categories add
        self.category_emb = nn.ModuleList(nn.Embedding(n + 1, d, padding_idx=0) for n in sizes)
        if not config.use_categories:
            self.category_emb = nn.ModuleList()
        for embedding in self.category_emb:
            assert isinstance(embedding, nn.Embedding)
            nn.init.zeros_(embedding.weight)
        if config.head == "moe":
            moe = MoEConfig(dim=features, hidden=config.hidden, out_dim=d, num_experts=config.num_experts,
                            top_k=config.top_k, num_tasks=config.num_tasks + len(config.category_task_names),
                            balancing=config.balancing,
                            bias_update_rate=config.bias_update_rate, dropout=config.dropout)  # fmt: skip
            self.moe: MoELayer | None = MoELayer(moe)
            self.dense: nn.Module | None = None
        else:
            self.moe = None
            self.dense = nn.Sequential(nn.Linear(features, config.hidden), nn.SiLU(), nn.Dropout(config.dropout),
                                       nn.Linear(config.hidden, d), nn.SiLU())  # fmt: skip
        ranking = nn.Linear(d, 1)
        if config.residual:  # the two stages start as the retriever alone
            nn.init.zeros_(ranking.weight)
            nn.init.zeros_(ranking.bias)
        self.outputs = nn.ModuleList([ranking, *(nn.Linear(d, 1) for _ in range(config.num_tasks - 1))])
        # category_l<k>: a class per value of level k and class 0 (none), never a target
        self.category_outputs = nn.ModuleList(nn.Linear(d, n + 1) for n in sizes[: len(config.category_task_names)])
        self.aux_loss = torch.zeros(())  # the MoE head's load loss of the last forward
        self._table = InferenceCache()  # `item_vectors`' table

    def head_parameters(self) -> int:
        """Parameters of the head one example uses (a MoE head: its routed and shared experts, and the routers)."""
        if self.moe is not None:
            return self.moe.active_parameters()
        assert self.dense is not None
        return sum(p.numel() for p in self.dense.parameters())

    def item_vectors(self, items: torch.Tensor, untrained: torch.Tensor | None = None) -> torch.Tensor:
        """(...) item_idx -> (..., D): the ID embedding, plus the projected content embedding and the category
        levels' embeddings; without gradients, rows of the whole table made once per state (`InferenceCache`):
        a call then gathers D numbers per item instead of projecting K. `untrained` (V+1,) bool: items no first
        stage was trained on, whose ID row is left out (an untrained row is noise): content and categories alone."""
        if not InferenceCache.applies():
            vectors = self._item_vectors(items)
        else:
            table = self._table.get("items", self._every_item_vector, reads=[*self.parameters(), *self.buffers()])
            vectors = gather_rows(table, items)
        if untrained is not None:
            vectors = vectors - self.item_emb(items) * untrained[items][..., None].to(vectors.dtype)
        return vectors

    def _every_item_vector(self) -> torch.Tensor:
        """(V+1, D): `item_vectors`' table, built only when its weights changed."""
        return self._item_vectors(torch.arange(self.config.num_items + 1, device=self.item_emb.weight.device))

    def _item_vectors(self, items: torch.Tensor) -> torch.Tensor:
        vectors = self.item_emb(items)
        if self.content_proj is not None:
            assert self.content is not None
            vectors = vectors + self.content_proj(self.content[items])
        if len(self.category_emb):
            assert self.categories is not None
            levels = self.categories[items]  # (..., K)
            for level, embedding in enumerate(self.category_emb):
                vectors = vectors + embedding(levels[..., level])
        return vectors

    def content_similarities(self, histories: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """(B, L) histories, (B, C) candidates -> (B, C, 3) cosine of each candidate's content to the last item's,
        the closest history item's and the average over the history (0 for an empty history)."""
        assert self.content is not None
        cand = gather_rows(self.content, candidates)  # (B, C, K)
        cosine = cand @ gather_rows(self.content, histories).transpose(1, 2)  # (B, C, L); padding rows are zeros
        real = (histories != 0)[:, None, :]
        closest = cosine.masked_fill(~real, -1.0).max(dim=-1).values * real.any(dim=-1)
        average = cosine.sum(dim=-1) / real.sum(dim=-1).clamp(min=1)
        return torch.stack([cosine[..., -1], closest, average], dim=-1)

    def forward(
        self,
        histories: torch.Tensor,
        candidates: torch.Tensor,
        retrieval: torch.Tensor,
        source_features: torch.Tensor | None = None,
        untrained: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L) left-padded item_idx, (B, C) candidates, (B, C) retriever scores [, (B, C, F) per-source features
        (`config.source_features` of them), (V+1,) bool the items no first stage was trained on (`item_vectors`)]
        -> (T, B, C) logits."""
        histories = histories[:, -self.config.max_history :]
        B, C = candidates.shape
        # the gap to the row's best retriever score: the same for a candidate whether the row holds all C
        # candidates (serving) or the target and the hardest negatives (training)
        gap = retrieval - retrieval.max(dim=1, keepdim=True).values
        x = self._features(histories, candidates, gap, source_features, untrained)
        tasks = range(self.config.num_tasks)
        hidden, self.aux_loss = self._head(x, tasks)
        logits = [head(z).view(B, C) for head, z in zip(self.outputs, hidden, strict=True)]
        if self.config.residual:
            logits[0] = logits[0] + gap.to(logits[0].dtype)
        return torch.stack(logits)

    def category_logits(self, histories: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(B, L) left-padded histories -> the next item's category logits at each level, K x (B, n_k + 1) (class
        0: none), from the user side alone (the head on a pseudo-candidate that is the last item, no retriever
        score), and the MoE head's load loss of that call."""
        histories = histories[:, -self.config.max_history :]
        last = histories[:, -1:]
        zeros = torch.zeros(*last.shape, self.config.source_features, device=histories.device)  # no source's
        x = self._features(histories, last, torch.zeros(last.shape, device=histories.device), zeros)
        first = self.config.num_tasks
        hidden, aux = self._head(x, range(first, first + len(self.category_outputs)))
        return [head(z) for head, z in zip(self.category_outputs, hidden, strict=True)], aux

    def _features(
        self,
        histories: torch.Tensor,
        candidates: torch.Tensor,
        gap: torch.Tensor,
        source_features: torch.Tensor | None,
        untrained: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L) histories, (B, C) candidates, (B, C) gaps to the row's best retriever score, (B, C, F) per-source
        features, the untrained items (`item_vectors`) -> (B * C, F') the head's input."""
        B, L = histories.shape
        C = candidates.shape[1]
        recency = torch.arange(L - 1, -1, -1, device=histories.device)  # 0 = the latest item, whatever the width
        h = self.item_vectors(histories, untrained) + self.pos_emb(recency)  # (B, L, D)
        pad = histories == 0
        pad = pad & ~pad.all(dim=1, keepdim=True)  # an empty history attends to its padding, not to nothing
        q = self.item_vectors(candidates, untrained)  # (B, C, D)
        interest, _ = self.attention(q, h, h, key_padding_mask=pad, need_weights=False)  # (B, C, D)
        last = h[:, -1:].expand(B, C, -1)
        parts = [q, interest, q * interest, q * last, gap[..., None]]
        if self.content is not None:
            parts.append(self.content_similarities(histories, candidates))
        if self.config.source_features:
            if source_features is None or source_features.shape[-1] != self.config.source_features:
                raise ValueError(f"the ranker reads {self.config.source_features} per-source features per candidate")
            parts.append(source_features.to(q.dtype))
        return torch.cat(parts, dim=-1).flatten(0, 1)

    def _head(self, x: torch.Tensor, tasks: range) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(N, F) -> the head's (N, D) output for each of `tasks` (indices of the MoE head's gates: the candidate
        tasks, then the category tasks), and its load loss."""
        if self.moe is not None:
            out = self.moe(x, tasks)
            return out.outputs, out.aux_loss
        assert self.dense is not None
        return [self.dense(x)] * len(tasks), x.new_zeros(())


@runtime_checkable
class SharedItemTable(Protocol):
    """A retriever whose input and output item vectors are one table (SASRec): a ranker may start from it."""

    def shared_item_table(self) -> torch.Tensor:
        """(V+1, D) that table."""
        ...


class TwoStageRanker(Model[RankerConfig]):
    """A frozen retriever's top-C, re-scored by a `Ranker`; `score` ranks every item (non-candidates -inf)."""

    def __init__(
        self,
        config: RankerConfig,
        retriever: Model[Any],
        content: torch.Tensor | None = None,
        categories: torch.Tensor | None = None,
        untrained: torch.Tensor | None = None,
        extra_retrievers: Sequence[Model[Any]] = (),
    ) -> None:
        """Args: as `Ranker`, untrained (V+1,) bool: the items no first stage was trained on, which a `new_items`
        source proposes (None: from a state dict), and the further first stages of the `model` sources."""
        super().__init__(config)
        if any(stage.reads_timestamps for stage in (retriever, *extra_retrievers)):
            raise ValueError(
                "a first stage of the ranker reads timestamps (HSTU with num_time_buckets > 0), which the ranking "
                "stage does not pass on yet: train it with num_time_buckets: 0"
            )
        self.retriever = retriever.eval().requires_grad_(False)
        self.extra_retrievers = nn.ModuleList(stage.eval().requires_grad_(False) for stage in extra_retrievers)
        self.ranker = Ranker(config, content, categories)
        if config.proposes_new_items and untrained is None:
            untrained = torch.zeros(config.num_items + 1, dtype=torch.bool)
        self.untrained: torch.Tensor | None
        self.register_buffer("untrained", untrained if config.proposes_new_items else None)
        self.last_source_calls: tuple[SourceCall, ...] = ()  # of the last `candidates` call, for serving's metrics
        self._neighbours = InferenceCache(reads_weights=False)  # `content_neighbours`': of the content buffer alone

    @property
    def max_history(self) -> int:
        """The longest of the stages' windows: each keeps its own most recent part."""
        stages = [self.retriever, *self.extra_retrievers]
        return max(self.config.max_history, *(stage.max_history for stage in stages))

    @property
    def extra_retriever_count(self) -> int:
        return len(self.extra_retrievers)

    @property
    def tasks(self) -> tuple[Task, ...]:
        """The tasks predicted beside ranking, in the head's order (outputs 1..)."""
        return tuple(Task(name, task_kind(name)) for name in self.config.tasks or ())

    @property
    def category_tasks(self) -> tuple[str, ...]:
        """The category tasks (category_l1 ..), in the order of `category_logits`."""
        return self.config.category_task_names

    def category_logits(self, histories: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(B, L) histories -> K x (B, n_k + 1) the next item's category logits per level, and the head's load
        loss of that call (`Ranker.category_logits`)."""
        return self.ranker.category_logits(histories)

    def item_categories(self, items: torch.Tensor) -> torch.Tensor:
        """(B,) items -> (B, K) their category ids at the predicted levels (0: none)."""
        assert self.ranker.categories is not None, "a ranker without category tasks"
        return self.ranker.categories[items.to(self.ranker.categories.device)][:, : len(self.category_tasks)]

    @torch.no_grad()
    def category_hits(self, histories: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """(B, L) histories, (B,) items -> (K, B) float: 1 where the predicted category of level k is the item's,
        0 where not, NaN where the item has none at that level (not measured)."""
        histories = histories.to(self.ranker.item_emb.weight.device)
        logits, _ = self.category_logits(histories)
        truth = self.item_categories(items).T  # (K, B)
        hits = torch.stack([z.argmax(dim=1) for z in logits]) == truth
        return torch.where(truth > 0, hits.float(), float("nan")).cpu()

    @property
    def aux_loss(self) -> torch.Tensor:
        """The MoE head's load loss of the last forward (0 for a dense head)."""
        return self.ranker.aux_loss

    def rank_candidates(
        self,
        histories: torch.Tensor,
        candidates: torch.Tensor,
        retrieval: torch.Tensor,
        source_features: torch.Tensor | None = None,
        untrained: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, L) histories, (B, C) candidates, their first-stage scores [, per-source features, and the items no
        first stage was trained on: default the model's own, with a new_items source] -> (T, B, C) the ranker's
        logits."""
        untrained = self.untrained if untrained is None else untrained
        return self.ranker(histories, candidates, retrieval, source_features, untrained)

    @property
    def new_items(self) -> torch.Tensor | None:
        """(V+1,) bool: the items no first stage was trained on, where a new_items source proposes them (else None;
        a property: a runtime protocol's isinstance check does not see buffers)."""
        return self.untrained

    def train(self, mode: bool = True) -> TwoStageRanker:
        super().train(mode)
        self.retriever.eval()  # frozen: no dropout in the first stages, ever
        self.extra_retrievers.eval()
        return self

    @torch.no_grad()
    def candidates(
        self,
        histories: torch.Tensor,
        users: torch.Tensor | None = None,
        retriever: Model[Any] | None = None,
        untrained: torch.Tensor | None = None,
        extra_retrievers: tuple[Model[Any], ...] = (),
    ) -> Candidates:
        """Each row's candidates, best first: the union of the sources' top-N with their features, or without
        `sources` the first stage's top-C. `retriever`, `extra_retrievers` and `untrained` stand in for the first
        stages and the items they were not trained on (the held-out twins', for training pairs)."""
        return self._candidates(histories, users, retriever, untrained, extra_retrievers)[0]

    def _candidates(
        self,
        histories: torch.Tensor,
        users: torch.Tensor | None,
        retriever: Model[Any] | None = None,
        untrained: torch.Tensor | None = None,
        extra_retrievers: tuple[Model[Any], ...] = (),
    ) -> tuple[Candidates, torch.Tensor]:
        """`candidates`, and the retriever's (B, V+1) scores of every item that they were made of."""
        if not self.config.sources:
            scores = self._first_stage_scores(histories, users, retriever)
            top = self._top(scores)
            return Candidates(top.indices, top.values, None), scores
        stages = extra_retrievers or cast(tuple[Model[Any], ...], tuple(self.extra_retrievers))  # ModuleList of Model
        content = self.ranker.content
        window = histories[:, -self.config.max_history :]
        untrained = self.untrained if untrained is None else untrained
        first_stage: list[torch.Tensor] = []  # the retriever's scores, made inside its timed call

        def score(source: CandidateSource) -> torch.Tensor:
            if source.kind == "retriever":
                first_stage.append(self._first_stage_scores(histories, users, retriever))
                return first_stage[0]
            if source.kind == "model":
                return self._first_stage_scores(histories, users, stages[source.index])
            if source.kind == "content":
                return neighbour_scores(self.content_neighbours(), window, source.recent)
            assert content is not None and untrained is not None  # new_items needs both, checked with the config
            return untrained_scores(content, window, source.recent, untrained)

        cosines: dict[int, torch.Tensor] = {}  # content kinds reading as many recent items share the union's cosines

        def cosine(source: CandidateSource, items: torch.Tensor) -> torch.Tensor:
            assert content is not None
            if source.recent not in cosines:
                cosines[source.recent] = recent_cosine(content, window, source.recent, items)
            return cosines[source.recent]

        candidates, calls = propose(self.config.sources, score, cosine, untrained)
        self.last_source_calls = tuple(calls)
        return candidates, first_stage[0]

    def content_neighbours(self) -> ContentNeighbours:
        """The `content` source's table of every item's nearest items by content, made once per content (kept
        while the content buffer is unchanged) rather than a (V+1)-wide product per call."""
        content = self.ranker.content
        top = next(source.top for source in self.config.sources if source.kind == "content")
        assert content is not None  # a content source needs use_content, checked with the config
        with torch.no_grad():
            return self._neighbours.get("content", lambda: content_neighbours(content, top), reads=[content])

    def _first_stage_scores(
        self, histories: torch.Tensor, users: torch.Tensor | None, retriever: Model[Any] | None = None
    ) -> torch.Tensor:
        scores = (retriever or self.retriever).score(histories, users).float()
        scores[:, 0] = float("-inf")
        return scores

    def _top(self, scores: torch.Tensor) -> torch.return_types.topk:
        return scores.topk(min(self.config.num_candidates, scores.shape[1] - 1), dim=1)

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories -> (B, V+1): the ranker's scores on the candidates (the new ones lifted by
        `new_item_prior`), -inf elsewhere (`times` are ignored: the first stage must not read them, see `__init__`)."""
        histories = histories.to(self.ranker.item_emb.weight.device)  # evaluation hands CPU rows to a CUDA model
        found = self.candidates(histories, users)
        logits = self.rank_candidates(histories, found.items, found.retrieval, found.features)[0].float()  # (B, C)
        if self.config.new_item_prior and self.untrained is not None:
            logits = logits + self.config.new_item_prior * self.untrained[found.items]
        out = torch.full((histories.shape[0], self.config.num_items + 1), float("-inf"), device=logits.device)
        out.scatter_(1, found.items, logits)
        out[:, 0] = float("-inf")  # the padding of rows with fewer candidates
        return out

    @torch.no_grad()
    def task_predictions(
        self, histories: torch.Tensor, items: torch.Tensor, users: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories, (B,) items -> (T-1, B): each task's prediction for the user's interaction
        with the item (a probability for binary tasks, the value for regression), the item scored among the first
        stage's candidates as when it is ranked (an item the first stage ranks nowhere counts as its last one)."""
        histories = histories.to(self.ranker.item_emb.weight.device)
        items = items.to(histories.device)
        found, scores = self._candidates(histories, users)
        item_scores = scores.gather(1, items[:, None])
        lowest = found.retrieval.min(dim=1, keepdim=True).values
        item_scores = torch.where(item_scores.isfinite(), item_scores, lowest)
        candidates = torch.cat([found.items, items[:, None]], dim=1)  # (B, C + 1), the item last
        retrieval = torch.cat([found.retrieval, item_scores], dim=1)
        features = None
        if found.features is not None:  # the item's own features where a source proposed it, else none
            match = found.items == items[:, None]
            at = match.float().argmax(dim=1)
            own = found.features[torch.arange(len(items), device=items.device), at] * match.any(dim=1, keepdim=True)
            features = torch.cat([found.features, own[:, None]], dim=1)
        logits = self.rank_candidates(histories, candidates, retrieval, features)[1:, :, -1].float()
        binary = torch.tensor([task.kind == "binary" for task in self.tasks], device=logits.device)[:, None]
        return torch.where(binary, torch.sigmoid(logits), logits)


def _build(fields: dict[str, Any], inputs: ModelInputs) -> TwoStageRanker:
    """A ranker over its trained first stage, frozen; it starts from the first stage's item vectors where those are
    the retriever's one item table (input and output tied) of the ranker's dim."""
    retriever = required(inputs.retriever, f"model 'ranker' re-scores a first stage. Fix: set {RETRIEVER.key}")
    check_items(retriever, fields["num_items"], RETRIEVER.key)
    for extra in inputs.extra_retrievers:
        check_items(extra, fields["num_items"], EXTRA_RETRIEVERS.key)
    extras = tuple(extra.saved() for extra in inputs.extra_retrievers)
    config = FAMILY.validate({**fields, "retriever": retriever.saved(), "extra_retrievers": extras})
    if config.sources:
        try:
            check_sources(config.sources, len(extras))
        except ValueError as err:
            raise ConfigError(f"model.params.{err}") from None
    elif extras:
        raise ConfigError(
            f"{EXTRA_RETRIEVERS.key} names {len(extras)} first stages and model.params.sources does not use them. "
            "Fix: list each as {kind: model, index: i, top: N} under sources"
        )
    shared = retriever.model.shared_item_table() if isinstance(retriever.model, SharedItemTable) else None
    items = shared if shared is not None and shared.shape[1] == config.dim else None
    if config.freeze_item_embeddings and items is None:
        raise ConfigError(
            f"model.params.freeze_item_embeddings keeps the item vectors of a first stage whose input and output item "
            f"vectors are one table of the ranker's dim ({config.dim}), e.g. a SASRec; this one is a "
            f"{retriever.family} model of another kind or size. Fix: set it to false"
        )
    content = content_of(inputs, config.num_items) if config.use_content else None
    if content is not None:
        config = dataclasses.replace(config, content_dim=content.shape[1])
    categories = None
    if config.use_categories or config.category_tasks:
        categories, sizes = _categories(inputs.categories, config)
        config = dataclasses.replace(config, category_sizes=sizes)
    config = dataclasses.replace(config, tasks=_tasks(config.tasks, inputs.tasks))
    untrained = None
    if config.proposes_new_items:
        counts = required(inputs.item_counts, "the new_items source needs the training data's item counts")
        untrained = untrained_items(counts)
    stages = [extra.model for extra in inputs.extra_retrievers]
    model = TwoStageRanker(config, retriever.model, content, categories, untrained, stages)
    if items is not None:
        with torch.no_grad():  # start from the retriever's item vectors: the ranker refines, not relearns
            model.ranker.item_emb.weight.copy_(items)
    return model


def _categories(table: CategoryTable | None, config: RankerConfig) -> tuple[torch.Tensor, tuple[int, ...]]:
    """(V+1, K) the category ids of the levels the ranker reads and each one's size: the top `category_levels`
    levels, fewer where the data's paths are shallower."""
    options = "model.params.use_categories / category_tasks"
    if table is None:
        raise ConfigError(
            f"{options} read the items' category paths, and the prepared data has none (no `category_path` in "
            "items.parquet). Fix: name the items' category file under data.attributes.categories (docs/data.md, "
            "'Item attributes') and prepare the data again, or set both to false"
        )
    if table.ids.shape[0] != config.num_items + 1:
        raise ConfigError(f"the category table has {table.ids.shape[0] - 1} items, the data {config.num_items}")
    deepest = sum(1 for size in table.sizes if size > 0)
    if not deepest:
        raise ConfigError(
            f"{options}: no item of the data has a category path. Fix: check data.attributes.categories' item ids "
            "against the data's (meta.json's attributes.categories.unknown_items), or set both to false"
        )
    levels = min(config.category_levels, deepest)
    return table.ids[:, :levels].clone(), tuple(table.sizes[:levels])


def _tasks(asked: tuple[str, ...] | None, available: tuple[str, ...]) -> tuple[str, ...]:
    """The ranker's tasks: those asked for (all the data has when None), each one the data has labels for."""
    if asked is None:
        return available
    missing = [task for task in asked if task not in available]
    if missing:
        raise ConfigError(
            f"model.params.tasks {list(asked)}: the data has no labels for {missing}. Fix: choose among "
            f"{list(available)} (recsys.data.tasks), or leave tasks out for all of them"
        )
    return tuple(asked)


def _reads(config: RankerConfig) -> frozenset[Input]:
    categories = {Input.CATEGORIES} if config.use_categories or config.category_tasks else set()
    counts = {Input.ITEM_COUNTS} if config.proposes_new_items else set()
    return frozenset({Input.TASKS} | ({Input.CONTENT} if config.use_content else set()) | categories | counts)


def _shape(config: RankerConfig, rebuild: Rebuild) -> TwoStageRanker:
    extras = [rebuild(extra) for extra in config.extra_retrievers]
    return TwoStageRanker(config, rebuild(config.retriever), extra_retrievers=extras)


RETRIEVER = UpstreamRole("retriever", Input.RETRIEVER, "the first stage whose top candidates it re-scores")
HOLDOUT_RETRIEVER = UpstreamRole(
    "holdout_retriever", Input.HOLDOUT_RETRIEVER, "that first stage trained without each user's last training items "
    "(its model.training.holdout_last), whose candidates it learns on", required=False,
)  # fmt: skip
EXTRA_RETRIEVERS = UpstreamRole(
    "extra_retrievers", Input.EXTRA_RETRIEVERS, "further first stages whose top-N are candidate sources (sources of "
    "kind model, by index)", many=True, required=False,
)  # fmt: skip
EXTRA_HOLDOUT_RETRIEVERS = UpstreamRole(
    "extra_holdout_retrievers", Input.EXTRA_HOLDOUT_RETRIEVERS, "each extra retriever trained without the same last "
    "items, in order (needed with holdout_retriever)", many=True, required=False,
)  # fmt: skip
FAMILY = ModelFamily(
    "ranker", RankerConfig, TwoStageRanker, _build, training="ranker", reads=_reads,
    upstream=(RETRIEVER, HOLDOUT_RETRIEVER, EXTRA_RETRIEVERS, EXTRA_HOLDOUT_RETRIEVERS), shape=_shape,
    filled={"num_items": 1, "retriever": {}, "extra_retrievers": (), "content_dim": 0, "category_sizes": ()},
)  # fmt: skip
