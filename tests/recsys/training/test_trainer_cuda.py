"""The training path on CUDA (bf16 autocast): skips without a CUDA device, runs where there is one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from recsys.data.prepared import load_prepared
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.runtime.device import use_bf16_autocast
from recsys.training.config import HardwareConfig
from recsys.training.trainer import fit
from tests.conftest import popularity_valid_metric, quick_train, tiny_generative


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


@pytest.mark.gpu
def test_a_generative_model_trains_through_replayed_graphs_of_its_loss_and_forward(tiny_data_dir: Path) -> None:
    """`reduce-overhead` on CUDA: the generative recipe's loss compiled with the forward (`loss_compiles_with_model`)
    runs as replayed CUDA graphs over batches of every history length, and the model learns as the eager one does."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device: run it on a machine with one")
    data = load_prepared(tiny_data_dir)
    eval_config = EvalConfig(ks=(10,))
    results = {}
    for compiled in (False, True):
        torch._dynamo.reset()
        hardware = HardwareConfig(compile=compiled, compile_mode="reduce-overhead" if compiled else "default")
        train = dataclasses.replace(quick_train(4, 32, 3e-3), hardware=hardware)
        results[compiled] = fit(tiny_generative(data.num_items), data, train, eval_config).best_valid["ndcg@10"]
    assert results[True] > 1.2 * popularity_valid_metric(data, eval_config, "ndcg@10")  # 1.38x on a CPU
    assert results[True] == pytest.approx(results[False], abs=0.02)  # bf16 kernels fused differently: not bit-equal
