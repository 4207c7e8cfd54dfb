"""Collaborative item vectors for semantic IDs: what the interactions say about items, where there is no item text
(Amazon Sports here) or beside it.

Items taken by the same users get close vectors: the truncated SVD of the user-item matrix of the training
sequences (1 where the user took the item), each entry divided by the square root of its user's and its item's
number of interactions (the symmetric normalisation of spectral collaborative filtering, so that neither heavy users
nor popular items dominate); an item's vector is its right singular vectors scaled by the square roots of the
singular values, L2-normalised. Only the training sequences are read, so validation and test items leak nothing.
An item no training sequence holds (a cold-start item) has no interactions: it gets a random unit vector (seeded),
so the codes of such items are spread over the codebooks rather than all alike.

Dimension letters: U users, V items, d dim.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pydantic import PositiveInt

from recsys.data.jagged import Jagged


@dataclass(frozen=True)
class CollaborativeVectors:
    """How collaborative item vectors are made (`sid.collaborative`)."""

    dim: PositiveInt = 64  # d, the SVD's rank
    seed: int = 0  # the randomised SVD's draws and the vectors of items without interactions


def collaborative_vectors(sequences: Jagged, num_items: int, config: CollaborativeVectors) -> np.ndarray:
    """(V, d) float32 vectors of items 1..V (row i - 1 is item_idx i) from the training `sequences` (item_idx rows).

    Example:
        >>> seqs = Jagged.from_lists([[1, 2], [2, 1, 2], [3, 4], [4, 3], [1, 2, 3]])
        >>> x = collaborative_vectors(seqs, 5, CollaborativeVectors(dim=2))
        >>> x.shape, bool(x[0] @ x[1] > x[0] @ x[3])  # 1 and 2 are taken together, 1 and 4 never
        ((5, 2), True)
    """
    if config.dim >= num_items:
        raise ValueError(f"sid.collaborative.dim: {config.dim} must be below the number of items ({num_items})")
    users = torch.repeat_interleave(torch.arange(len(sequences)), sequences.lengths())
    taken = torch.sparse_coo_tensor(
        torch.stack([users, sequences.values - 1]),
        torch.ones(len(users)),
        (len(sequences), num_items),
        check_invariants=True,
    ).coalesce()
    index = taken.indices()
    per_user = torch.zeros(len(sequences)).index_add_(0, index[0], torch.ones(index.shape[1]))
    per_item = torch.zeros(num_items).index_add_(0, index[1], torch.ones(index.shape[1]))
    weights = (per_user[index[0]] * per_item[index[1]]).rsqrt()
    normalised = torch.sparse_coo_tensor(index, weights, taken.shape, check_invariants=True)
    with torch.random.fork_rng(devices=[]):  # svd_lowrank draws its projection from the global generator: seed a copy
        torch.manual_seed(config.seed)
        _, s, v = torch.svd_lowrank(normalised, q=config.dim, niter=4)
        vectors = v * s.sqrt()  # (V, d)
        unseen = per_item == 0
        vectors[unseen] = torch.randn(int(unseen.sum()), config.dim)
    return torch.nn.functional.normalize(vectors, dim=1).numpy().astype(np.float32)
