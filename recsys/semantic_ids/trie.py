"""A trie of valid semantic IDs as dense per-level tables, for constrained beam search on any device.

Every item has a code tuple (c_1, ..., c_T). A prefix of length t is one int64 key in mixed radix
(key = ((c_1 * K_2) + c_2) * K_3 + ...). For every level t the trie stores the sorted keys of the valid
length-t prefixes and a (num_prefixes_t, K_{t+1}) bool table of the codes that may follow each of them,
so a decoding step is one `searchsorted` and one gather, batched over users and beams.

Dimension letters: V items, T code levels, B users, W beams, K codes at a level.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SemanticIdTrie:
    """Valid semantic IDs of a catalog.

    Args:
        prefix_keys: per level t = 0..T-1, sorted int64 keys of the valid length-t prefixes (t = 0: [0]).
        allowed: per level t, (len(prefix_keys[t]), K_t) bool: code c may follow that prefix.
        item_keys: sorted int64 keys of the full tuples; `item_of_key[i]` is the item with key item_keys[i].
        item_of_key: (V,) item_idx aligned with item_keys.
        radix: (T,) K_t, the size of each level's codebook.
    """

    prefix_keys: tuple[torch.Tensor, ...]
    allowed: tuple[torch.Tensor, ...]
    item_keys: torch.Tensor
    item_of_key: torch.Tensor
    radix: torch.Tensor

    @staticmethod
    def build(codes: torch.Tensor, item_idx: torch.Tensor, radix: list[int]) -> SemanticIdTrie:
        """Args: codes (V, T) int64, unique per row; item_idx (V,) the items; radix: K_t per level.

        Example:
            >>> trie = SemanticIdTrie.build(torch.tensor([[0, 1], [0, 2], [1, 0]]), torch.tensor([7, 8, 9]), [2, 3])
            >>> trie.allowed[1].tolist()  # after code 0: codes 1, 2; after code 1: code 0
            [[False, True, True], [True, False, False]]
        """
        if codes.ndim != 2 or codes.shape[1] != len(radix):
            raise ValueError(f"codes must be (V, {len(radix)}), got {tuple(codes.shape)}")
        if bool((codes < 0).any()) or bool((codes >= torch.tensor(radix)).any()):
            raise ValueError("every code must lie in [0, K_t) of its level")
        keys = torch.zeros(codes.shape[0], dtype=torch.int64)
        prefix_keys, allowed = [], []
        for t, size in enumerate(radix):
            unique, row = torch.unique(keys, sorted=True, return_inverse=True)
            table = torch.zeros(len(unique), size, dtype=torch.bool)
            table[row, codes[:, t]] = True
            prefix_keys.append(unique)
            allowed.append(table)
            keys = keys * size + codes[:, t]
        order = torch.argsort(keys)
        if bool((keys[order][1:] == keys[order][:-1]).any()):
            raise ValueError("two items share a semantic ID: de-duplicate the codes first")
        return SemanticIdTrie(tuple(prefix_keys), tuple(allowed), keys[order], item_idx[order], torch.tensor(radix))

    @property
    def levels(self) -> int:
        return len(self.allowed)

    def to(self, device: torch.device | str) -> SemanticIdTrie:
        return SemanticIdTrie(
            tuple(k.to(device) for k in self.prefix_keys),
            tuple(a.to(device) for a in self.allowed),
            self.item_keys.to(device),
            self.item_of_key.to(device),
            self.radix.to(device),
        )

    def rows(self, level: int, keys: torch.Tensor) -> torch.Tensor:
        """keys (...,) of valid length-`level` prefixes -> (...,) their rows in the level's tables.

        A key that is no valid prefix (a dead beam's, when fewer prefixes than beams exist) gets some valid prefix's
        row, in bounds: what follows a dead beam does not matter, its score stays -inf."""
        keys_t = self.prefix_keys[level]
        return torch.searchsorted(keys_t, keys).clamp(max=len(keys_t) - 1)

    def allowed_next(self, level: int, keys: torch.Tensor) -> torch.Tensor:
        """keys (...,) of valid length-`level` prefixes -> (..., K_level) bool of the codes that may follow."""
        return self.allowed[level][self.rows(level, keys)]

    def conditional_log_shares(self, weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per level t, (len(prefix_keys[t]), K_t): log of the share of a prefix's weight that each code after it
        holds, log(w(prefix + c) / w(prefix)), where an ID's weight is the sum of its items' (0 where c may not follow).
        Summed over an item's levels they give log(w_item / w_all).

        Args:
            weights: (V+1,) positive weight of every item_idx (e.g. its training count + 1), on the trie's device.

        Example:
            >>> trie = SemanticIdTrie.build(torch.tensor([[0, 1], [0, 2], [1, 0]]), torch.tensor([1, 2, 3]), [2, 3])
            >>> [t.exp().tolist() for t in trie.conditional_log_shares(torch.tensor([0.0, 1.0, 3.0, 4.0]))]
            [[[0.5, 0.5]], [[1.0, 0.25, 0.75], [1.0, 1.0, 1.0]]]
        """
        w = weights[self.item_of_key].double()  # (V,) aligned with item_keys
        below = torch.ones(self.levels + 1, dtype=torch.int64, device=self.radix.device)  # IDs under one prefix
        below[:-1] = torch.flip(torch.cumprod(torch.flip(self.radix, [0]), 0), [0])
        shares = []
        for t in range(self.levels):
            prefix, code = self.item_keys // below[t], (self.item_keys // below[t + 1]) % self.radix[t]
            mass = torch.zeros(self.allowed[t].shape, dtype=torch.float64, device=w.device)
            mass.index_put_((self.rows(t, prefix), code), w, accumulate=True)
            share = mass / mass.sum(dim=1, keepdim=True)
            shares.append(torch.where(mass > 0, share, 1.0).log().float())
        return tuple(shares)

    def items(self, keys: torch.Tensor) -> torch.Tensor:
        """keys (...,) of complete tuples -> item_idx (...,); a key of no item (a dead beam's) gets some item."""
        return self.item_of_key[torch.searchsorted(self.item_keys, keys).clamp(max=len(self.item_keys) - 1)]
