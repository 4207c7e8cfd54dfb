"""Two-tower retrieval: a user tower and an item tower meet in a dot product, so items can be served from a
FAISS index of their vectors (Yi et al., RecSys 2019; Yang et al., WWW 2020 for mixed negatives).

Sparse features go through torchrec's `KeyedJaggedTensor` into an `EmbeddingBagCollection`-compatible module
(`FusedEmbeddingBagCollection`: the project's Triton kernels on CUDA, torch elsewhere):
    item tower: item id + sum of its semantic-ID prefix embeddings (levels 1..sid_levels) + a projection of its
                content (LLM) embedding, then an MLP. `content_first`: the item-id feature counts with the chance
                count / (count + residual_half_count) (kept or dropped in training, weighted so when scoring), so an
                item never trained is placed by its content and prefixes alone (`recsys.modules.content_items`).
    user tower: `pooled` (default): the mean of the history's item embeddings, the mean of the most recent `recent`
                items and the hashed user id, then an MLP; `sequence`: a causal transformer over the history's
                item-tower vectors (the towers share what they know of items), its last state + the hashed user id,
                then an MLP.
Both towers end in a head (a linear map plus an MLP) and L2 normalisation; logits = cosine / temperature. Training
(`model.training.objective`): "pairs", in-batch negatives with logQ correction plus uniformly drawn random negatives
(`recsys.training.recipes.TwoTowerRecipe`); "next_item", a sequence tower on packed rows, every position predicting its
next item over the catalogue, as SASRec trains (`forward`).

torchrec (with fbgemm, seconds to import) is imported when a model is built, not when its config is checked.

Dimension letters: B users, H history, V+1 items, D dim, C content dim, L prefix levels.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from pydantic import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from torch import nn

from recsys.data.schema import PADDING_IDX
from recsys.data.times import HistoryTimes
from recsys.errors import ConfigError
from recsys.models.family import (
    DEFAULT_MAX_HISTORY,
    Input,
    Model,
    ModelFamily,
    ModelInputs,
    content_of,
    item_counts_of,
    semantic_id_codes,
)
from recsys.modules.content_items import keep_probability
from recsys.modules.sid_embedding import prefix_ids
from recsys.modules.table_training import TableOptimizer, TableTraining
from recsys.modules.transformer import TransformerBlock, causal_segment_mask, left_padded_layout
from recsys.ops.embedding_bag import Kernel
from recsys.runtime.extras import optional
from recsys.runtime.validation import Fraction, check_heads

if TYPE_CHECKING:
    from torchrec import EmbeddingBagConfig, KeyedJaggedTensor


@dataclass(frozen=True)
class TwoTowerConfig:
    num_items: int  # V
    max_history: PositiveInt = DEFAULT_MAX_HISTORY  # history items the user tower reads
    # "pooled" (the default, which saved models and their results were made with) or "sequence" (docs/models.md)
    user_tower: Literal["pooled", "sequence"] = "pooled"
    num_layers: PositiveInt = 2  # of the sequence tower
    num_heads: PositiveInt = 2  # of the sequence tower
    recent: PositiveInt = 3  # the pooled tower's most recent items, pooled apart from the whole history
    dim: PositiveInt = 64
    hidden_dim: PositiveInt = 256
    dropout: Fraction = 0.2
    temperature: PositiveFloat = 0.05
    user_buckets: NonNegativeInt = 0  # hashed user-id feature (0 = none)
    sid_levels: NonNegativeInt = 0  # semantic-ID prefix features of the item tower (needs codes)
    use_content: bool = False  # feed the item's content (LLM) embedding to the item tower
    content_dim: NonNegativeInt = 0  # its size, filled in from the embeddings by the registry
    # the item-id feature counts with chance count / (count + residual_half_count): items never trained are placed
    # by their content and semantic-ID prefixes alone (needs use_content or sid_levels; reads the training counts)
    content_first: bool = False
    residual_half_count: NonNegativeFloat = 10.0
    # "table_wise" / "row_wise": the sparse features use torchrec's own EmbeddingBagCollection, which a distributed
    # run shards over its processes with DistributedModelParallel (`recsys.training.model_parallel`; row_wise on
    # CUDA only); "none": the project's FusedEmbeddingBagCollection (Triton kernels on CUDA), on every process
    shard_tables: Literal["none", "table_wise", "row_wise"] = "none"
    # sharded tables train with fbgemm's optimizer fused into the backward pass, apart from train.optimization.lr's
    # Adam (which fbgemm's CPU kernels lack: "adam" needs CUDA)
    table_optimizer: TableOptimizer = "rowwise_adagrad"
    table_lr: PositiveFloat = 0.01
    # the lookups' backend with shard_tables "none": "auto" = Triton on CUDA, torch elsewhere
    embedding_kernel: Literal["auto", "torch", "triton"] = "auto"

    def __post_init__(self) -> None:
        check_heads(self.num_heads, self.dim)
        if self.embedding_kernel != "auto" and self.shard_tables != "none":
            raise ValueError(
                f"embedding_kernel {self.embedding_kernel!r} picks the backend of the unsharded tables; sharded ones "
                "(shard_tables table_wise / row_wise) use torchrec's. Fix: embedding_kernel: auto"
            )
        if self.content_first and not (self.use_content or self.sid_levels):
            raise ValueError(
                "content_first needs use_content or sid_levels: something other than the id to place items"
            )


class _Head(nn.Module):
    """A tower's head: a linear map of its features plus an MLP of them. Without the linear path an MLP's output at
    initialisation is mostly its shared offset (GELU's positive mean through the last layer): every item's vector, and
    every user's, starts nearly the same (cosine ~0.8 between items), and training sits on that plateau for epochs."""

    def __init__(self, in_dim: int, hidden: int, out: int, dropout: float) -> None:
        super().__init__()
        self.linear = nn.Linear(in_dim, out)
        last = nn.Linear(hidden, out)
        self.mlp = nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Dropout(dropout), last)
        # the head starts as its linear map, centred: items (and users) start apart, not at a shared offset
        nn.init.zeros_(self.linear.bias)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.mlp(x)


def _bag(name: str, rows: int, dim: int, pooling: Literal["MEAN", "SUM"]) -> EmbeddingBagConfig:
    """A table whose rows start at about unit length (uniform in ±sqrt(3 / dim): each coordinate's variance 1 / dim).
    torchrec's default, ±sqrt(1 / rows), starts a 12,000-item table's rows near 0.01 long: the item tower's output is
    then its MLP's biases, the same vector for every item, and training sits on that plateau for epochs."""
    from torchrec import EmbeddingBagConfig, PoolingType

    bound = math.sqrt(3.0 / dim)
    return EmbeddingBagConfig(
        name=name, embedding_dim=dim, num_embeddings=rows, feature_names=[name], pooling=PoolingType[pooling],
        weight_init_min=-bound, weight_init_max=bound,
    )  # fmt: skip


class TwoTower(Model[TwoTowerConfig]):
    """User and item towers over torchrec sparse features; scores all items by a dot product.

    Args:
        config: sizes and features.
        codes: (V+1, >= sid_levels) semantic IDs when `sid_levels` > 0 (None: from a state dict).
        content: (V+1, content_dim) content embeddings when `content_dim` > 0 (None: from a state dict).
    """

    prefix_rows: torch.Tensor  # (V+1, L) row of each item's prefix of each length in the "sid_prefix" table
    content: torch.Tensor  # (V+1, C) frozen content embeddings (empty when content_dim = 0)
    counts: torch.Tensor  # (V+1,) training counts (content_first; empty otherwise)

    def __init__(
        self,
        config: TwoTowerConfig,
        codes: torch.Tensor | None = None,
        content: torch.Tensor | None = None,
        counts: torch.Tensor | None = None,
    ) -> None:
        optional("torchrec", extra="torchrec", feature="the two-tower model (its features are torchrec KJTs)")
        from recsys.modules.embedding_bag_collection import FusedEmbeddingBagCollection
        from recsys.modules.ordered_embedding_bags import OrderedEmbeddingBags

        super().__init__(config)
        V1, D, L = config.num_items + 1, config.dim, config.sid_levels
        pooled = config.user_tower == "pooled"
        user_tables = [_bag("history", V1, D, "MEAN"), _bag("recent", V1, D, "MEAN")] if pooled else []
        if config.user_buckets:
            user_tables.append(_bag("user", config.user_buckets + 1, D, "SUM"))
        item_tables = [_bag("item_id", V1, D, "SUM")]
        if L:
            item_tables.append(_bag("sid_prefix", L * V1 + 1, D, "SUM"))  # row 0: padding
        if config.shard_tables == "none":
            kernel = None if config.embedding_kernel == "auto" else Kernel(config.embedding_kernel)
            bags: Callable[[list[EmbeddingBagConfig]], nn.Module] = partial(FusedEmbeddingBagCollection, kernel=kernel)
        else:
            bags = OrderedEmbeddingBags
        self.user_features = bags(user_tables) if user_tables else None
        self.item_features = bags(item_tables)
        self.sequence = None if pooled else _SequenceTower(config)
        self.user_mlp = _Head((len(user_tables) + (not pooled)) * D, config.hidden_dim, D, config.dropout)
        item_in = len(item_tables) * D + (D if config.content_dim else 0)
        self.item_mlp = _Head(item_in, config.hidden_dim, D, config.dropout)
        self.content_proj = nn.Linear(config.content_dim, D) if config.content_dim else None
        self.register_buffer("prefix_rows", torch.zeros(V1, L, dtype=torch.long))
        if L and codes is not None:
            # level l's prefixes take rows 1 + l*(V+1) ...: at most V distinct prefixes per level
            self.prefix_rows.copy_(prefix_ids(codes[:, :L]) + torch.arange(L) * V1)
        self.register_buffer("content", torch.zeros(V1, config.content_dim))
        if config.content_dim and content is not None:
            self.content.copy_(content)
        self.register_buffer("counts", torch.zeros(V1 if config.content_first else 0))
        if config.content_first and counts is not None:
            self.counts.copy_(counts)

    @property
    def max_history(self) -> int:
        return self.config.max_history

    def table_training(self) -> TableTraining | None:
        """How a distributed run shards and trains its sparse tables (`model.shard_tables`); None: it does not."""
        config = self.config
        if config.shard_tables == "none":
            return None
        return TableTraining(config.shard_tables, config.table_optimizer, config.table_lr)

    def encode_queries(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, H) left-padded histories [+ (B,) user_idx] -> (B, D) unit user vectors (`times` are ignored)."""
        histories = histories.to(self.prefix_rows.device)[:, -self.config.max_history :]
        features: dict[str, torch.Tensor] = {}
        if self.sequence is None:
            features = {"history": histories, "recent": histories[:, -self.config.recent :]}
        if self.config.user_buckets:
            bucket = torch.zeros(histories.shape[0], 1, dtype=torch.long, device=histories.device)
            if users is not None:
                users = users.to(histories.device).long()
                bucket = torch.where(users > 0, 1 + (users - 1) % self.config.user_buckets, 0)[:, None]
            features["user"] = bucket
        parts = [] if self.user_features is None else [self.user_features(_jagged(features)).values()]
        if self.sequence is not None:
            layout = left_padded_layout(histories, self.config.max_history)
            parts.insert(0, self.sequence(*layout, self.encode_items)[:, -1])
        return self._user_head(torch.cat(parts, dim=1))

    def forward(self, item_ids: torch.Tensor, segments: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Packed rows (`recsys.data.batching`: (B, L) item_idx, segments, positions) -> (B, L, D) the user vector at
        every position / temperature, so its dot products with `item_embeddings()` are the logits of the position's
        next item: what the next-item recipe trains (`model.training.objective: next_item`)."""
        self.check_packed_rows()
        assert self.sequence is not None  # checked above: for the type checker
        device = self.prefix_rows.device
        states = self.sequence(item_ids.to(device), segments.to(device), positions.to(device), self.encode_items)
        return self._user_head(states) / self.config.temperature

    def check_packed_rows(self) -> None:
        """ConfigError unless the user tower reads packed rows: a sequence tower without per-user features (a packed
        row holds several users' sequences)."""
        if self.sequence is None or self.config.user_buckets:
            raise ConfigError(
                "model.training.objective next_item trains the user tower on packed rows of sequences, which only a "
                f"sequence tower without user features reads (this one: user_tower {self.config.user_tower!r}, "
                f"user_buckets {self.config.user_buckets}). Fix: set model.params.user_tower: sequence and "
                "user_buckets: 0, or model.training.objective: pairs"
            )

    def _user_head(self, features: torch.Tensor) -> torch.Tensor:
        """(..., F) the user tower's features -> (..., D) unit user vectors."""
        with _fp32_heads():
            return F.normalize(self.user_mlp(features.float()), dim=-1)

    def encode_items(self, items: torch.Tensor) -> torch.Tensor:
        """(N,) item_idx -> (N, D) unit item vectors."""
        items = items.to(self.prefix_rows.device)
        features = {"item_id": items[:, None]}
        if self.config.sid_levels:
            features["sid_prefix"] = (self.prefix_rows[items] + 1).masked_fill((items == PADDING_IDX)[:, None], 0)
        looked_up = self.item_features(_jagged(features)).values()
        if self.config.content_first:  # the item-id feature (the first D columns) counts with its keep chance
            keep = keep_probability(self.counts[items], self.config.residual_half_count)
            if self.training:
                keep = torch.bernoulli(keep)
            looked_up = torch.cat([looked_up[:, : self.config.dim] * keep[:, None], looked_up[:, self.config.dim :]], 1)
        parts = [looked_up]
        if self.content_proj is not None:
            parts.append(self.content_proj(self.content[items]))
        with _fp32_heads():
            return F.normalize(self.item_mlp(torch.cat(parts, dim=1).float()), dim=-1)

    def item_embeddings(self) -> torch.Tensor:
        """(V+1, D) vectors of every item (what the FAISS index holds); the padding row is zero."""
        vectors = self.encode_items(torch.arange(self.config.num_items + 1, device=self.prefix_rows.device))
        return vectors.masked_fill(torch.arange(vectors.shape[0], device=vectors.device)[:, None] == 0, 0.0)

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, H) histories [+ (B,) users] -> (B, V+1) logits = cosine / temperature (`times` are ignored)."""
        return self.encode_queries(histories, users) @ self.item_embeddings().T / self.config.temperature


class _SequenceTower(nn.Module):
    """A causal transformer over the history's item-tower vectors (SASRec's, Kang & McAuley 2018, over the shared
    item tower): its state at every position."""

    def __init__(self, config: TwoTowerConfig) -> None:
        super().__init__()
        D = config.dim
        self.positions = nn.Embedding(config.max_history, D)
        nn.init.normal_(self.positions.weight, std=D**-0.5)  # the scale of a unit vector's coordinates
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(D, config.num_heads, 4 * D, config.dropout, config.dropout)
            for _ in range(config.num_layers)
        )
        self.norm = nn.LayerNorm(D)

    def forward(
        self,
        item_ids: torch.Tensor,
        segments: torch.Tensor,
        positions: torch.Tensor,
        encode_items: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """(B, L) item_idx, their segments (0 = padding) and positions (`left_padded_layout`, or packed rows) ->
        (B, L, D)."""
        present = segments != 0
        vectors = torch.zeros(*item_ids.shape, self.positions.embedding_dim, device=item_ids.device)
        vectors[present] = encode_items(item_ids[present]).to(vectors.dtype)  # padding rows stay zero
        x = self.dropout(vectors + self.positions(positions)) * present[..., None]
        mask = causal_segment_mask(segments)
        for block in self.blocks:
            x = block(x, mask)
        return self.norm(x)


@contextmanager
def _fp32_heads() -> Iterator[None]:
    """The towers' MLP heads outside CUDA bf16 autocast. With both heads' dropout running in bf16, an ID-only two-tower
    (Sports, H100, torch 2.11) drove its training loss to 0.01 within two epochs while validation stayed near
    popularity: it fitted something of the batch, not the items. fp32, or either head without dropout, trains normally;
    the cause inside the bf16 path was not isolated. The heads are small, so fp32 costs little;
    tests/recsys/models/test_two_tower_cuda.py guards it."""
    with torch.autocast("cuda", enabled=False), torch.autocast("cpu", enabled=False):
        yield


def _jagged(features: dict[str, torch.Tensor]) -> KeyedJaggedTensor:
    """{name: (B, n) ids, 0 = none} -> a KeyedJaggedTensor with the non-zero ids of each row as one bag."""
    from torchrec import KeyedJaggedTensor

    keys = list(features)
    dense = [features[k] for k in keys]
    lengths = torch.cat([(d != 0).sum(dim=1) for d in dense])
    values = torch.cat([d[d != 0] for d in dense])
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)


def _build(fields: dict[str, Any], inputs: ModelInputs) -> TwoTower:
    config = FAMILY.validate(fields)
    codes = semantic_id_codes(inputs, FAMILY.name, config.num_items, config.sid_levels)
    counts = item_counts_of(inputs, FAMILY.name, config.num_items).float() if config.content_first else None
    if not config.use_content:
        return TwoTower(config, codes, counts=counts)
    content = content_of(inputs, config.num_items)
    return TwoTower(dataclasses.replace(config, content_dim=content.shape[1]), codes, content, counts)


def _reads(config: TwoTowerConfig) -> frozenset[Input]:
    return frozenset(
        {*([Input.SEMANTIC_IDS] if config.sid_levels else []), *([Input.CONTENT] if config.use_content else []),
         *([Input.ITEM_COUNTS] if config.content_first else [])}
    )  # fmt: skip


FAMILY = ModelFamily(
    "two_tower", TwoTowerConfig, TwoTower, _build, training="two_tower", reads=_reads,
    filled={"num_items": 1, "content_dim": 0},
)  # fmt: skip
