"""The semantic-ID trie: one path per item, codes checked against the codebook sizes."""

from __future__ import annotations

import torch

from recsys.semantic_ids.trie import SemanticIdTrie


def test_trie_rejects_duplicate_ids_and_out_of_range_codes() -> None:
    for codes, match in ((torch.tensor([[0, 1], [0, 1]]), "share a semantic ID"), (torch.tensor([[0, 5]]), "[0, K_t)")):
        try:
            SemanticIdTrie.build(codes, torch.arange(1, len(codes) + 1), [2, 3])
        except ValueError as err:
            assert match in str(err)
        else:
            raise AssertionError(f"accepted {codes.tolist()}")
