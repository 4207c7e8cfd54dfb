"""SASRec (Kang & McAuley, ICDM 2018): a causal transformer over the user's item sequence.

Trained on every position (the hidden state at t predicts item t+1); item embeddings are shared
between input and output, so scores are `hidden @ item_embeddings.T`. Losses live in
`recsys.training.losses`. An item's vector is its ID embedding, or the sum of its semantic-ID prefixes' embeddings,
or (`content_first`) a function of its content embedding plus an ID residual
(`recsys.modules.content_items`), so that items never trained get a vector from their text.

Dimension letters: B batch, L sequence length (left-padded with 0), D dim, V+1 items.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import NonNegativeFloat, NonNegativeInt, PositiveInt
from torch import nn
from torch.distributed.tensor import DTensor

from recsys.data.schema import PADDING_IDX
from recsys.data.times import HistoryTimes
from recsys.models.family import (
    DEFAULT_MAX_HISTORY,
    Input,
    Model,
    ModelFamily,
    ModelInputs,
    content_of,
    item_counts_of,
    required,
    semantic_id_codes,
)
from recsys.modules.content_items import ContentFirstItems
from recsys.modules.sid_embedding import SemanticIdEmbedding
from recsys.modules.transformer import TransformerBlock, causal_segment_mask, left_padded_layout
from recsys.ops.embedding_bag import Kernel
from recsys.runtime.validation import Fraction, check_heads


@dataclass(frozen=True)
class SASRecConfig:
    num_items: int  # V; embeddings have V+1 rows, row 0 is padding
    max_history: PositiveInt = DEFAULT_MAX_HISTORY  # most recent items the model reads
    dim: PositiveInt = 64
    num_layers: PositiveInt = 2
    num_heads: PositiveInt = 2
    ffn_dim: PositiveInt = 256
    dropout: Fraction = 0.5  # strong dropout suits the small, sparse Amazon datasets
    attn_dropout: Fraction = 0.5
    # > 0: add the embeddings of the item's first `sid_levels` semantic-ID prefixes (needs codes), which lets
    # the model score items it never saw in training
    sid_levels: NonNegativeInt = 0
    id_embeddings: bool = True  # False (with sid_levels > 0): items are represented by their semantic ID only
    # items = MLP(content embedding) [+ semantic-ID prefixes] + an ID residual (id_embeddings) kept in training with
    # probability count / (count + residual_half_count), weighted so when scoring: zero for items never trained
    content_first: bool = False
    residual_half_count: NonNegativeFloat = 10.0
    content_dim: NonNegativeInt = 0  # C, filled in from the content embeddings when content_first
    encoder: str = ""  # the content encoder (`content.model`), filled in when content_first: new items embed with it
    # embedding-bag backend of the semantic-ID lookup: "auto" = Triton on CUDA, torch elsewhere
    embedding_kernel: Literal["auto", "torch", "triton"] = "auto"

    def __post_init__(self) -> None:
        check_heads(self.num_heads, self.dim)
        if not (self.id_embeddings or self.sid_levels or self.content_first):
            raise ValueError("id_embeddings: false needs sid_levels > 0 or content_first, or nothing represents the "
                             "items")  # fmt: skip
        if self.content_first and self.content_dim < 1:
            raise ValueError("content_first needs the items' content embeddings (content_dim >= 1)")


class SASRec(Model[SASRecConfig]):
    """Causal self-attention sequential retriever.

    Example:
        >>> model = SASRec(SASRecConfig(num_items=10, max_history=4, dim=8, num_heads=1, ffn_dim=16))
        >>> model.eval().score(torch.tensor([[0, 3, 4, 5]])).shape
        torch.Size([1, 11])
    """

    def __init__(
        self,
        config: SASRecConfig,
        codes: torch.Tensor | None = None,
        content: torch.Tensor | None = None,
        counts: torch.Tensor | None = None,
    ) -> None:
        """Args: config; codes (V+1, >= sid_levels) semantic IDs when `sid_levels` > 0; content (V+1, content_dim)
        embeddings and counts (V+1,) training counts when `content_first` (each None: from a state dict)."""
        super().__init__(config)
        plain_ids = config.id_embeddings and not config.content_first
        self.item_emb = nn.Embedding(config.num_items + 1, config.dim, padding_idx=PADDING_IDX) if plain_ids else None
        kernel = None if config.embedding_kernel == "auto" else Kernel(config.embedding_kernel)
        self.sid_emb = (
            SemanticIdEmbedding(config.num_items, config.sid_levels, config.dim, codes, kernel)
            if config.sid_levels
            else None
        )
        self.pos_emb = nn.Embedding(config.max_history, config.dim)
        self.emb_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(config.dim, config.num_heads, config.ffn_dim, config.dropout, config.attn_dropout)
            for _ in range(config.num_layers)
        )
        self.final_norm = nn.LayerNorm(config.dim)
        self.apply(_init_weights)
        self.content_items = (  # after the init above: it initialises its own weights
            ContentFirstItems.of_size(
                config.num_items, config.content_dim, config.dim, config.residual_half_count, content, counts,
                residual=config.id_embeddings,
            )
            if config.content_first
            else None
        )  # fmt: skip

    def forward(
        self,
        item_ids: torch.Tensor,
        segments: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        items: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden state at every position.

        Args:
            item_ids: (B, L) item_idx. Without `segments`: one left-padded history per row (L > max_history
                keeps the most recent max_history columns).
            segments: (B, L) run ids of packed rows (`recsys.data.batching`), 0 = padding.
            positions: (B, L) position ids of packed rows; required with `segments`.
            items: (V+1, D) item vectors to read instead of `item_embeddings()` (e.g. with domain adapters).

        Returns:
            (B, L, D).
        """
        item_ids = item_ids.to(self.pos_emb.weight.device)
        if segments is None:
            item_ids, segments, positions = left_padded_layout(item_ids, self.config.max_history)
        elif positions is None:
            raise ValueError("packed rows need `positions` with `segments`")
        if items is None and self._reads_rows:
            embedded = self.item_rows(item_ids)  # the table's gradient: the rows read, not all of it
        else:  # F.embedding, not indexing: indexing's CUDA backward (index_put_ accumulating) took 13.8 ms of a
            # 2,048-row step (docs/distributed.md)
            embedded = F.embedding(item_ids, self.item_embeddings() if items is None else items)
        x = embedded * math.sqrt(self.config.dim) + self.pos_emb(positions)  # (B, L, D)
        x = self.emb_dropout(x) * (segments != 0)[..., None]
        mask = causal_segment_mask(segments)
        for block in self.blocks:
            x = block(x, mask)
        return self.final_norm(x)

    @property
    def max_history(self) -> int:
        return self.config.max_history

    @property
    def _reads_rows(self) -> bool:
        """Whether the table must be read through its module, row by row: its gradient is row-sparse, or its rows are
        sharded over the processes (a DTensor, `recsys.training.row_sharding`)."""
        return self.item_emb is not None and (self.item_emb.sparse or isinstance(self.item_emb.weight, DTensor))

    def item_id_table(self) -> nn.Embedding | None:
        """The ID table when it alone is the items' vectors (training may read it row by row, or split its rows over
        processes: `recsys.training.capabilities.ItemIdTable`); None when semantic IDs or content build them."""
        return self.item_emb if self.sid_emb is None else None

    def replace_item_id_table(self, table: nn.Embedding) -> None:
        self.item_emb = table

    def shared_item_table(self) -> torch.Tensor:
        """(V+1, D) the one item table of the input and the output (a ranker may start from it)."""
        return self.item_embeddings()

    def item_rows(self, items: torch.Tensor) -> torch.Tensor:
        """(..., D) the vectors of `items`, as `item_embeddings()[items]`, read row by row where the table allows."""
        if self.item_emb is not None and self.sid_emb is None:
            return self.item_emb(items)
        return self.item_embeddings()[items]

    def item_embeddings(self) -> torch.Tensor:
        """(V+1, D) item vectors, shared by the input and the output: the sum of the ID embedding, the semantic-ID
        prefixes and the content-first vectors the config has."""
        parts = []
        if self.content_items is not None:
            parts.append(self.content_items())
        if self.sid_emb is not None:
            parts.append(self.sid_emb(torch.arange(self.config.num_items + 1, device=self.pos_emb.weight.device)))
        if self.item_emb is not None:
            parts.append(self.item_emb.weight)
        return parts[0] if len(parts) == 1 else torch.stack(parts).sum(0)

    def encode_queries(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories -> (B, D) user vectors (hidden state of the last column); `users` and
        `times` are ignored (the vector models share this signature)."""
        return self(histories)[:, -1]

    @property
    def content_encoder(self) -> str | None:
        """The encoder of its items' texts when they are content-first (`recsys.inference.ContentItemScorer`)."""
        return self.config.encoder if self.content_items is not None else None

    def vectors_of_content(self, content: torch.Tensor) -> torch.Tensor:
        """(N, C) content embeddings of new items -> (N, D) their vectors, as a never-trained item of the catalogue
        gets (no residual). Only for content-first items without semantic-ID prefixes: a new item's codes would need
        the tokenizer, which the model does not hold."""
        if self.content_items is None or self.sid_emb is not None:
            raise ValueError(
                "this SASRec cannot place items it never trained on: its items "
                + ("add semantic-ID prefixes, which a new item has none of" if self.sid_emb is not None else
                   "are not content-first")
                + ". Fix: train it with model.params.content_first: true and sid_levels: 0 (docs/models.md)"
            )  # fmt: skip
        return self.content_items.of_content(content)

    def encode_queries_over(self, histories: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """(B, L) left-padded histories indexing `items` (V+1+N, D) -> (B, D) user vectors."""
        return self(histories, items=items)[:, -1]

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories -> (B, V+1) scores over all items (`users` and `times` are ignored)."""
        return self.encode_queries(histories) @ self.item_embeddings().T


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear | nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.Embedding) and module.padding_idx is not None:
        with torch.no_grad():
            module.weight[module.padding_idx].zero_()


def _build(fields: dict[str, Any], inputs: ModelInputs) -> SASRec:
    if not fields.get("content_first"):
        config = FAMILY.validate(fields)
        return SASRec(config, semantic_id_codes(inputs, FAMILY.name, config.num_items, config.sid_levels))
    num_items = fields["num_items"]
    content = content_of(inputs, num_items)
    encoder = required(
        inputs.content_encoder,
        "model 'sasrec' with content_first embeds new items with the content's encoder, and none is known. Fix: "
        "build it through the pipeline, whose embed_content step names it",
    )
    config = FAMILY.validate({**fields, "content_dim": content.shape[1], "encoder": encoder})
    codes = semantic_id_codes(inputs, FAMILY.name, num_items, config.sid_levels)
    return SASRec(config, codes, content, item_counts_of(inputs, FAMILY.name, num_items))


def _reads(config: SASRecConfig) -> frozenset[Input]:
    content = {Input.CONTENT, Input.ITEM_COUNTS} if config.content_first else set()
    return frozenset({*content, *([Input.SEMANTIC_IDS] if config.sid_levels else [])})


# its semantic-ID index, content embeddings and counts come with the state dict
FAMILY = ModelFamily(
    "sasrec", SASRecConfig, SASRec, _build, training="next_item", reads=_reads,
    filled={"num_items": 1, "content_dim": 1, "encoder": ""},
)  # fmt: skip
