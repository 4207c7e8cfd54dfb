"""Semantic-ID prefix features let SASRec score items it never saw in training (cold start)."""

from __future__ import annotations

import torch

from recsys.data.prepared import SequenceData
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.modules.sid_embedding import prefix_ids
from tests.recsys.modules.cold_start import cold_recall, structured_codes


def test_prefix_ids_are_shared_exactly_by_items_with_the_same_prefix() -> None:
    codes = torch.tensor([[-1, -1, -1], [0, 1, 0], [0, 1, 1], [0, 2, 0], [3, 1, 0]])
    ids = prefix_ids(codes)
    assert ids[0].tolist() == [0, 0, 0]
    assert ids[1, 0] == ids[2, 0] == ids[3, 0] != ids[4, 0]
    assert ids[1, 1] == ids[2, 1] != ids[3, 1]
    assert len(set(ids[1:, 2].tolist())) == 4


def test_without_id_embeddings_items_with_the_same_prefixes_share_a_vector() -> None:
    codes = torch.tensor([[-1, -1], [0, 1], [0, 1], [1, 0]])
    model = SASRec(
        SASRecConfig(num_items=3, max_history=4, dim=8, num_heads=1, ffn_dim=8, sid_levels=2, id_embeddings=False),
        codes,
    )
    table = model.item_embeddings()
    torch.testing.assert_close(table[1], table[2])
    assert not torch.allclose(table[1], table[3])


def test_sid_features_score_cold_items_that_id_only_sasrec_cannot(cold_data: SequenceData) -> None:
    base = dict(num_items=cold_data.num_items, max_history=20, dim=32, num_heads=1, ffn_dim=64, dropout=0.1)
    id_only = cold_recall(cold_data, SASRecConfig(**base), None)  # type: ignore[arg-type]
    # The category prefix only: on this tiny catalog most deeper prefixes of a cold item are unseen too.
    sid = SASRecConfig(**base, sid_levels=1, id_embeddings=False)  # type: ignore[arg-type]
    with_sid = cold_recall(cold_data, sid, structured_codes(cold_data))
    assert id_only < 0.02, "an ID-only model cannot know items it never trained on"
    assert with_sid > id_only + 0.05
