"""Collaborative item vectors: items taken by the same users are close, held-out items get random vectors, and the
vectors follow the seed without touching the global random state."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recsys.data.jagged import Jagged
from recsys.semantic_ids.collaborative import CollaborativeVectors, collaborative_vectors


def two_groups(users: int = 40) -> Jagged:
    """Half the users take items 1-5, half items 6-10 (item 11: nobody)."""
    g = torch.Generator().manual_seed(0)
    rows = [(torch.randperm(5, generator=g)[:3] + 1 + 5 * (u % 2)).tolist() for u in range(users)]
    return Jagged.from_lists(rows)


def test_items_of_the_same_users_are_closer_than_items_of_others() -> None:
    x = collaborative_vectors(two_groups(), 11, CollaborativeVectors(dim=2))  # rank 2: the two groups
    assert x.shape == (11, 2) and x.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, rtol=1e-5)
    same, other = x[:5] @ x[:5].T, x[:5] @ x[5:10].T
    assert same[~np.eye(5, dtype=bool)].min() > other.max()


def test_an_item_nobody_took_gets_a_seeded_random_vector_and_the_global_state_is_left_alone() -> None:
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    first = collaborative_vectors(two_groups(), 11, CollaborativeVectors(dim=4, seed=7))
    assert torch.equal(torch.rand(1), expected_next)  # the SVD's draws came from a copy of the global generator
    again = collaborative_vectors(two_groups(), 11, CollaborativeVectors(dim=4, seed=7))
    other_seed = collaborative_vectors(two_groups(), 11, CollaborativeVectors(dim=4, seed=8))
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first[10], other_seed[10])  # item 11's vector is the seed's draw
    assert abs(float(first[10] @ first[:10].mean(axis=0))) < 1.0


def test_a_rank_of_the_catalogue_size_is_refused() -> None:
    with pytest.raises(ValueError, match="must be below the number of items"):
        collaborative_vectors(two_groups(), 11, CollaborativeVectors(dim=11))
