"""The evaluation protocol (docs/training.md): leave-one-out, ranking over all items, batched.

Dimension letters: B users in a batch, L history length, V+1 items (0 = padding), U users of the split.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from pydantic import NonNegativeInt, PositiveFloat, PositiveInt

from recsys.data.jagged import Jagged
from recsys.data.prepared import EvalSplit
from recsys.evaluation.item_blocks import rank_in_item_blocks
from recsys.evaluation.metrics import catalog_coverage, ranking_metrics, target_ranks
from recsys.evaluation.uncertainty import Uncertainty
from recsys.inference import Scorer, VectorScorer, mask_unrankable, padded_width, top_k
from recsys.runtime.budget import Budget, limit
from recsys.runtime.distributed import Workers, gather_rows
from recsys.runtime.progress import Progress

logger = logging.getLogger(__name__)

DEFAULT_KS = (5, 10, 50)


@dataclass(frozen=True)
class EvalConfig:
    """How to evaluate. Defaults are the platform's protocol (nothing excluded)."""

    ks: tuple[PositiveInt, ...] = DEFAULT_KS
    # Mask the user's history items before ranking. Off by default: the published protocol ranks
    # every item, and a target that repeats a history item then counts as a miss.
    exclude_seen: bool = False
    batch_size: PositiveInt = 1024
    # Items scored at once for a user batch of a model with item vectors (`VectorScorer`): memory follows
    # batch_size x item_block instead of batch_size x V (about 9 bytes a pair: 0.6 GB at the defaults, whatever V).
    # A catalogue of at most item_block items is scored whole, as other models' always are; 0 = always whole.
    item_block: NonNegativeInt = 65_536
    # Budgets of one evaluation, checked between user batches: past either, a `BudgetExceeded` that names the knob
    # instead of a kernel OOM kill (docs/scale.md). They bound the run, not its result; None: unbounded.
    max_seconds: PositiveFloat | None = None
    max_memory_gb: PositiveFloat | None = None  # the process's resident memory (not the GPU's), GiB
    # the intervals of every metric and the paired test of two models (`recsys.evaluation.uncertainty`)
    uncertainty: Uncertainty = field(default_factory=Uncertainty)

    def budget(self) -> Budget:
        """The budget of one `evaluate` call, with the knobs that raise it and the ways to shrink the work."""
        return Budget(
            "evaluation",
            seconds=limit(
                self.max_seconds,
                "--max-seconds (eval.max_seconds in a config)",
                "evaluate a sample of the users (recsys evaluate --users N)",
            ),
            memory_gb=limit(
                self.max_memory_gb,
                "--max-memory-gb (eval.max_memory_gb in a config)",
                "lower eval.batch_size or eval.item_block (--item-block N)",
            ),
        )


@dataclass(frozen=True)
class UserSample:
    """A seeded random sample of a split's users, for a quick look: its metrics are not the protocol's (which ranks
    every user's target), so `EvalResult.sample` says they come from it."""

    users: PositiveInt  # how many (every user when the split has fewer)
    seed: int = 0

    def rows(self, num_users: int) -> torch.Tensor:
        """The sampled rows of a split of `num_users` users, ascending; the same for the same seed.

        Example:
            >>> UserSample(users=3, seed=1).rows(10).tolist() == UserSample(users=3, seed=1).rows(10).tolist()
            True
        """
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randperm(num_users, generator=generator)[: self.users].sort().values


@dataclass(frozen=True)
class EvalResult:
    """Metrics averaged over the evaluated users plus each one's target rank (for slices)."""

    metrics: dict[str, float]
    # (U,) 0-based rank of each user's target, in the split's user order; with a sample, of the sampled users only,
    # in the order of `sample.rows(U)`
    ranks: torch.Tensor
    # (U, min(max(ks), V)) each user's list of the best items, best first, in the order of `ranks`
    top_items: torch.Tensor
    config: EvalConfig = field(default_factory=EvalConfig)
    sample: UserSample | None = None  # set: the metrics are over this sample of len(ranks) users, not the protocol's


@torch.no_grad()
def evaluate(
    scorer: Scorer,
    split: EvalSplit,
    num_items: int,
    config: EvalConfig | None = None,
    sample: UserSample | None = None,
    workers: Workers | None = None,
    what: str = "evaluation",
) -> EvalResult:
    """Rank every user's target among all V items and average the metrics.

    Users are batched by history length so each batch is padded only to its own longest history (at most the
    `scorer.max_history` items the model reads). A model with item vectors ranks a catalogue larger than
    `config.item_block` a block of items at a time (`rank_in_item_blocks`); the others score it whole. Progress
    (users/s, ETA) is logged every few seconds; `config.max_seconds` / `max_memory_gb` are checked after each batch.

    Args:
        scorer: model with `score(histories, users, times) -> (B, V+1)`.
        split: histories and targets (e.g. `SequenceData.eval_split("test")`).
        num_items: V.
        config: ks, exclusion and batching; defaults to the platform's protocol.
        sample: evaluate only this sample of the users (a quick look, labelled as such in the result).
        workers: the processes of a distributed run, which every one of them calls this with: each ranks every
            world_size-th user, and all get the ranks of every user, so the metrics are the single process's exactly.
        what: what is evaluated, for the progress lines, e.g. "evaluation of test" or "popularity on validation".

    Raises:
        BudgetExceeded: the evaluation ran past `config.max_seconds` or held more than `config.max_memory_gb`.
    """
    config = config or EvalConfig()
    list_length = min(max(config.ks), num_items)  # a catalogue smaller than the longest list is listed whole
    users = torch.arange(len(split.targets)) if sample is None else sample.rows(len(split.targets))
    blocks = _vectors_for_item_blocks(scorer, num_items, config.item_block)
    workers = workers or Workers()
    mine = users[workers.rank :: workers.world_size]
    ranks = torch.empty(len(users), dtype=torch.int64)
    tops = torch.empty(len(users), list_length, dtype=torch.int64)
    guard = config.budget().start()
    progress = Progress(logger, what, total=len(mine), unit="users", rows_are="users")
    for rows, histories, width in history_batches(split, scorer.max_history, config.batch_size, mine):
        padded, times, targets = histories.to_padded(width), split.times(rows, width), split.targets[rows]
        seen = histories if config.exclude_seen else None
        if blocks is None:
            scores = scorer.score(padded, split.user_idx[rows], times).float()  # (B, V+1)
            scores = mask_unrankable(scores, seen, candidates=split.candidates)
            batch_ranks, batch_tops = target_ranks(scores, targets.to(scores.device)), top_k(scores, list_length)[1]
        else:
            vector_scorer, item_vectors = blocks
            batch_ranks, batch_tops = rank_in_item_blocks(
                vector_scorer.encode_queries(padded, split.user_idx[rows], times),
                item_vectors,
                targets,
                seen,
                split.candidates,
                list_length,
                config.item_block,
            )
        slots = torch.searchsorted(users, rows)  # `users` is ascending: where each row's results go
        ranks[slots], tops[slots] = batch_ranks.cpu(), batch_tops.cpu()
        progress.update(done=progress.rows + len(rows), rows=len(rows))
        guard.check(f"after {progress.rows:,} of {len(mine):,} users")
    progress.finish()
    if workers.distributed:
        ranks, tops = _gathered(ranks, tops, workers)
    metrics = ranking_metrics(ranks, config.ks)
    for k in config.ks:
        metrics[f"coverage@{k}"] = catalog_coverage(tops[:, :k], num_items)
    return EvalResult(metrics=metrics, ranks=ranks, top_items=tops, config=config, sample=sample)


def _gathered(ranks: torch.Tensor, tops: torch.Tensor, workers: Workers) -> tuple[torch.Tensor, torch.Tensor]:
    """Every process's results in place: rank r filled the slots r, r + world_size, ... of `ranks` and `tops`."""
    slots = torch.arange(workers.rank, len(ranks), workers.world_size)
    mine = torch.cat([slots[:, None], ranks[slots, None], tops[slots]], dim=1)
    for theirs in gather_rows(mine, workers):
        ranks[theirs[:, 0]], tops[theirs[:, 0]] = theirs[:, 1], theirs[:, 2:]
    return ranks, tops


def _vectors_for_item_blocks(
    scorer: Scorer, num_items: int, item_block: int
) -> tuple[VectorScorer, torch.Tensor] | None:
    """The scorer and its (V+1, D) item vectors when the catalogue is to be ranked in blocks of `item_block` items;
    None when it is scored whole: it fits in one block, or the model has no item vectors."""
    if not item_block or num_items <= item_block:
        return None
    if not isinstance(scorer, VectorScorer):
        logger.info(
            "%s has no item vectors: scoring all %d items at once per user batch (item_block %d applies to models "
            "with item vectors)",
            type(scorer).__name__,
            num_items,
            item_block,
        )
        return None
    return scorer, scorer.item_embeddings()


def history_batches(
    split: EvalSplit, max_history: int, batch_size: int, rows: torch.Tensor | None = None
) -> Iterator[tuple[torch.Tensor, Jagged, int]]:
    """`split`'s users (or those of `rows`) in batches of similar history length: (rows, their histories, the padded
    width), so each batch is padded only to its own longest history (at most the `max_history` items the model
    reads)."""
    rows = torch.arange(len(split.targets)) if rows is None else rows
    lengths = split.histories.lengths()[rows].clamp(max=max_history)
    for batch in torch.split(torch.argsort(lengths, stable=True), batch_size):
        histories = split.histories.select(rows[batch])
        yield rows[batch], histories, padded_width(histories, max_history)
