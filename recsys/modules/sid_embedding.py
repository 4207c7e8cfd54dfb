"""Item embeddings from semantic-ID prefixes ("Better Generalization with Semantic IDs", Singh et al. 2024).

An item's vector is the sum of one embedding per prefix of its semantic ID: (c1), (c1, c2), ..., (c1..cL).
Items that share a prefix share that embedding, so an item never seen in training still gets a vector
from what its prefixes learned on other items.

Dimension letters: V items (+1 for padding index 0), L prefix levels, D dim.
"""

from __future__ import annotations

import torch
from torch import nn

from recsys.data.schema import PADDING_IDX


class SemanticIdEmbedding(nn.Module):
    """Sum of prefix embeddings.

    Args:
        num_items: V.
        levels: L, how many leading code levels form prefixes.
        dim: D.
        codes: (V+1, >= L) int64 semantic IDs by item_idx (row 0 ignored); None when the weights and the
            prefix index come from a state dict.

    Example:
        >>> codes = torch.tensor([[-1, -1], [0, 1], [0, 2], [1, 1]])
        >>> emb = SemanticIdEmbedding(num_items=3, levels=2, dim=4, codes=codes)
        >>> emb.prefix_index.tolist()  # items 1 and 2 share the prefix (0,); 0 = padding
        [[0, 0], [1, 1], [1, 2], [2, 3]]
    """

    prefix_index: torch.Tensor  # (V+1, L) dense id of every item's prefix of each length, 0 for padding

    def __init__(self, num_items: int, levels: int, dim: int, codes: torch.Tensor | None = None) -> None:
        super().__init__()
        # At most V distinct prefixes per level: fixed sizes keep saved models loadable without the codes.
        self.tables = nn.ModuleList(nn.Embedding(num_items + 1, dim, padding_idx=PADDING_IDX) for _ in range(levels))
        self.register_buffer("prefix_index", torch.zeros(num_items + 1, levels, dtype=torch.long))
        if codes is not None:
            self.prefix_index.copy_(prefix_ids(codes[:, :levels]))

    def forward(self, item_ids: torch.Tensor) -> torch.Tensor:
        """(...) item_idx -> (..., D)."""
        index = self.prefix_index[item_ids]  # (..., L)
        return sum((table(index[..., level]) for level, table in enumerate(self.tables)), torch.zeros(()))


def prefix_ids(codes: torch.Tensor) -> torch.Tensor:
    """(V+1, L) codes -> (V+1, L) dense ids (1-based) of every item's length-(l+1) prefix; row 0 -> 0."""
    out = torch.zeros_like(codes, dtype=torch.long)
    items = codes[1:].long()
    for level in range(codes.shape[1]):
        _, inverse = torch.unique(items[:, : level + 1], dim=0, return_inverse=True)
        out[1:, level] = inverse + 1
    return out
