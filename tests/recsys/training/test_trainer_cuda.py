"""The training path on CUDA (bf16 autocast): skips without a CUDA device, runs where there is one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from recsys.data.prepared import load_prepared
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.runtime.device import use_bf16_autocast
from recsys.training.trainer import fit
from tests.conftest import popularity_valid_metric, quick_train


@pytest.mark.gpu
def test_fit_on_cuda_with_bf16_matches_a_cpu_evaluation(tiny_data_dir: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: run it on a machine with one")
    data = load_prepared(tiny_data_dir)
    model = SASRec(SASRecConfig(num_items=data.num_items, max_history=20, dim=32, num_heads=1, ffn_dim=64, dropout=0.1))
    eval_config = EvalConfig(ks=(10,))
    result = fit(
        model,
        data,
        quick_train(4, 4, 3e-3),
        eval_config,
    )
    assert use_bf16_autocast("auto", torch.device("cuda"))
    assert next(model.parameters()).device.type == "cuda"
    assert next(model.parameters()).dtype == torch.float32  # autocast, not a bf16 model
    on_gpu = result.best_valid["ndcg@10"]
    on_cpu = evaluate(model.cpu(), data.eval_split("valid"), data.num_items, eval_config).metrics["ndcg@10"]
    assert on_gpu == pytest.approx(on_cpu, abs=2e-3)
    assert on_cpu > 1.5 * popularity_valid_metric(data, eval_config)
