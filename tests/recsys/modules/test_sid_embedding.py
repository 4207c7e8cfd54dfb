"""Semantic-ID prefix features let SASRec score items it never saw in training (cold start)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import torch

from features.prepare import prepare
from features.settings import PrepareSettings
from features.sources import load_source
from recsys.data.prepared import SequenceData, load_prepared
from recsys.evaluation import EvalConfig, evaluate
from recsys.evaluation.slices import slice_metrics
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.modules.sid_embedding import prefix_ids
from recsys.training.config import HardwareConfig, OptimizationConfig, ScheduleConfig, TrainConfig
from recsys.training.trainer import fit


def structured_codes(data: SequenceData) -> torch.Tensor:
    """(V+1, 3) codes = (category, brand, de-dup) of the synthetic catalog; row 0 = padding."""
    items = data.items.with_columns(
        pl.col("category").rank("dense").cast(pl.Int64).alias("c0") - 1,
        pl.col("brand").rank("dense").cast(pl.Int64).alias("c1") - 1,
    ).with_columns(pl.int_range(pl.len()).over("c0", "c1").alias("c2"))
    codes = torch.tensor(items.select("c0", "c1", "c2").to_numpy(), dtype=torch.long)
    return torch.cat([torch.full((1, 3), -1, dtype=torch.long), codes])


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


@pytest.fixture(scope="module")
def cold_data(tmp_path_factory: pytest.TempPathFactory) -> SequenceData:
    out = tmp_path_factory.mktemp("cold") / "prepared"
    prepare(
        load_source("synthetic", None, num_users=400, num_items=150),
        out,
        PrepareSettings(cold_start_fraction=0.2, seed=3),
    )
    return load_prepared(Path(out))


def cold_recall(data: SequenceData, config: SASRecConfig, codes: torch.Tensor | None) -> float:
    torch.manual_seed(0)
    model = SASRec(config, codes)
    eval_config = EvalConfig(ks=(10,))
    fit(
        model,
        data,
        TrainConfig(
            schedule=ScheduleConfig(epochs=6),
            optimization=OptimizationConfig(batch_size=4, lr=3e-3),
            hardware=HardwareConfig(precision="fp32"),
            progress=False,
        ),
        eval_config,
    )
    split = data.eval_split("test")
    ranks = evaluate(model, split, data.num_items, eval_config).ranks
    cold = data.cold_mask[split.targets]
    assert int(cold.sum()) >= 10, "the cold slice must not be empty"
    return slice_metrics(ranks, cold, (10,))["recall@10"]


def test_sid_features_score_cold_items_that_id_only_sasrec_cannot(cold_data: SequenceData) -> None:
    base = dict(num_items=cold_data.num_items, max_history=20, dim=32, num_heads=1, ffn_dim=64, dropout=0.1)
    id_only = cold_recall(cold_data, SASRecConfig(**base), None)  # type: ignore[arg-type]
    # The category prefix only: on this tiny catalog most deeper prefixes of a cold item are unseen too.
    sid = SASRecConfig(**base, sid_levels=1, id_embeddings=False)  # type: ignore[arg-type]
    with_sid = cold_recall(cold_data, sid, structured_codes(cold_data))
    assert id_only < 0.02, "an ID-only model cannot know items it never trained on"
    assert with_sid > id_only + 0.05
