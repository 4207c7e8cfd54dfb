"""torchrec's `EmbeddingBagCollection`, held so that its output keeps the tables' order once DMP has sharded it.

A sharded collection returns its features grouped by where they were looked up (table-wise over 2 processes, tables
a, b, c give keys a, c, b), so a caller that reads `KeyedTensor.values()` by position would mix features silently.
This module re-keys the output in its tables' order; unsharded, the order is already right and nothing is copied.

Dimension letters: B batch, F features, D dim.

Example:
    >>> from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
    >>> tables = [EmbeddingBagConfig(name=n, embedding_dim=4, num_embeddings=10, feature_names=[n]) for n in "ab"]
    >>> bags = OrderedEmbeddingBags(tables)
    >>> ids = KeyedJaggedTensor.from_lengths_sync(["a", "b"], torch.tensor([1, 2, 3]), torch.tensor([1, 1, 1, 0]))
    >>> out = bags(ids)
    >>> out.keys(), tuple(out.values().shape)
    (['a', 'b'], (2, 8))
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor


class OrderedEmbeddingBags(nn.Module):
    """A torchrec `EmbeddingBagCollection` (`bags`, what DMP's sharders replace) whose output is in `tables` order.

    Args:
        tables: the collection's `EmbeddingBagConfig`s; the output's keys are their features, in this order.
        device: where the tables live.
    """

    def __init__(self, tables: Sequence[EmbeddingBagConfig], device: torch.device | str | None = None) -> None:
        super().__init__()
        self.tables = list(tables)
        self.bags: nn.Module = EmbeddingBagCollection(
            self.tables, device=None if device is None else torch.device(device)
        )
        self.features = [name for table in self.tables for name in table.feature_names]

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """KJT -> KeyedTensor (B, F*D), keys in `tables` order whether `bags` is sharded or not."""
        pooled = self.bags(features)  # sharded: an awaitable, waited on by the first attribute read
        if pooled.keys() == self.features:
            return pooled
        by_name = pooled.to_dict()
        return KeyedTensor.from_tensor_list(self.features, [by_name[name] for name in self.features])
