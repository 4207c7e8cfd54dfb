"""Item embeddings from semantic-ID prefixes ("Better Generalization with Semantic IDs", Singh et al. 2024).

An item's vector is the sum of one embedding per prefix of its semantic ID: (c1), (c1, c2), ..., (c1..cL).
Items that share a prefix share that embedding, so an item never seen in training still gets a vector
from what its prefixes learned on other items.

Dimension letters: V items (+1 for padding index 0), L prefix levels, D dim.
"""

from __future__ import annotations

import torch
from torch import nn

from recsys.ops.embedding_bag import Kernel, embedding_bag


class SemanticIdEmbedding(nn.Module):
    """Sum of prefix embeddings, looked up as one embedding bag of L ids per item (`recsys.ops.embedding_bag`).

    The L prefix tables live in one flat (L * (V+1), D) buffer, level l's table at rows l*(V+1)...; row 0 of
    every level is padding (zero, never updated), which is what the padding item and unused slots map to.

    Args:
        num_items: V.
        levels: L, how many leading code levels form prefixes.
        dim: D.
        codes: (V+1, >= L) int64 semantic IDs by item_idx (row 0 ignored); None when the weights and the
            prefix index come from a state dict.
        kernel: embedding-bag backend (`Kernel.TORCH`, `Kernel.TRITON`); None = TRITON on CUDA, else TORCH.

    Example:
        >>> codes = torch.tensor([[-1, -1], [0, 1], [0, 2], [1, 1]])
        >>> emb = SemanticIdEmbedding(num_items=3, levels=2, dim=4, codes=codes)
        >>> emb.prefix_index.tolist()  # items 1 and 2 share the prefix (0,); 0 = padding
        [[0, 0], [1, 1], [1, 2], [2, 3]]
        >>> torch.equal(emb(torch.tensor(1)), emb.weight[1] + emb.weight[4 + 1])  # level 1 starts at row V+1
        True
    """

    prefix_index: torch.Tensor  # (V+1, L) dense id of every item's prefix of each length, 0 for padding
    level_start: torch.Tensor  # (L,) first row of each level's table in `weight`

    def __init__(
        self, num_items: int, levels: int, dim: int, codes: torch.Tensor | None = None, kernel: Kernel | None = None
    ) -> None:
        super().__init__()
        self.kernel = kernel
        # At most V distinct prefixes per level: fixed sizes keep saved models loadable without the codes.
        self.weight = nn.Parameter(torch.empty(levels * (num_items + 1), dim))
        self.register_buffer("prefix_index", torch.zeros(num_items + 1, levels, dtype=torch.long))
        self.register_buffer("level_start", torch.arange(levels) * (num_items + 1), persistent=False)
        if codes is not None:
            self.prefix_index.copy_(prefix_ids(codes[:, :levels]))
        nn.init.normal_(self.weight, std=0.02)
        with torch.no_grad():
            self.weight[self.level_start].zero_()
        # nn.Embedding's padding_idx: the padding rows get no gradient, so they stay zero
        self.weight.register_hook(lambda grad: grad.index_fill(0, self.level_start, 0.0))

    def forward(self, item_ids: torch.Tensor) -> torch.Tensor:
        """(...) item_idx -> (..., D)."""
        rows = (self.prefix_index[item_ids.reshape(-1)] + self.level_start).reshape(-1)  # (N*L,) one bag per item
        levels = self.level_start.numel()
        offsets = torch.arange(0, rows.numel() + 1, levels, device=rows.device)
        pooled = embedding_bag(self.weight, rows, offsets, kernel=self.kernel, sparse_grad=False)  # (N, D)
        return pooled.reshape(*item_ids.shape, -1)


def prefix_ids(codes: torch.Tensor) -> torch.Tensor:
    """(V+1, L) codes -> (V+1, L) dense ids (1-based) of every item's length-(l+1) prefix; row 0 -> 0."""
    out = torch.zeros_like(codes, dtype=torch.long)
    items = codes[1:].long()
    for level in range(codes.shape[1]):
        _, inverse = torch.unique(items[:, : level + 1], dim=0, return_inverse=True)
        out[1:, level] = inverse + 1
    return out
