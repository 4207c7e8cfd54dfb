"""A small cold-start data set and the cold-slice recall of a SASRec trained on it: shared by the tests of the item
representations that reach cold items (semantic-ID prefixes, content-first vectors)."""

from __future__ import annotations

from typing import Any

import polars as pl
import torch

from recsys.data.prepared import SequenceData
from recsys.evaluation import EvalConfig, evaluate
from recsys.evaluation.slices import slice_metrics
from recsys.models.family import Model
from recsys.models.sasrec import SASRec, SASRecConfig
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


def cold_recall(
    data: SequenceData, config: SASRecConfig, codes: torch.Tensor | None, model: Model[Any] | None = None
) -> float:
    """Test R@10 on the users whose target is cold, of `model` (default: a new SASRec of `config` and `codes`) trained
    for a few epochs."""
    torch.manual_seed(0)
    model = model or SASRec(config, codes)
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
