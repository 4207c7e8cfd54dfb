"""torch, fbgemm-gpu and torchrec must be a matched trio: an ABI mismatch fails here, at import."""

from __future__ import annotations

import torch


def test_embedding_bag_collection_forward() -> None:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

    tables = [EmbeddingBagConfig(name="item_table", embedding_dim=4, num_embeddings=10, feature_names=["history"])]
    ebc = EmbeddingBagCollection(tables=tables)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["history"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1])
    )
    pooled = ebc(kjt).to_dict()["history"]
    weight = ebc.embedding_bags["item_table"].weight
    torch.testing.assert_close(pooled, torch.stack([weight[1] + weight[2], weight[3]]))


def test_fbgemm_operator_runs() -> None:
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)

    offsets = torch.ops.fbgemm.asynchronous_complete_cumsum(torch.tensor([2, 0, 3]))
    assert offsets.tolist() == [0, 2, 2, 5]
