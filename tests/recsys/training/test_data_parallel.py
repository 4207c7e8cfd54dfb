"""Data-parallel training on real gloo process groups started by torch's elastic launcher: two processes train the
model one process trains, and their split evaluation gives the single process's metrics exactly."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from recsys.data.batching import HistoryBatch
from recsys.data.prepared import load_prepared
from recsys.errors import ConfigError
from recsys.evaluation import evaluate
from recsys.runtime.distributed import Workers
from recsys.training.data_parallel import share_of_rows
from tests.recsys.training.distributed_fit import EVAL, small_sasrec, train_and_save

# docs/distributed.md states them: gradients equal up to float sums; after two epochs, the metrics within 0.01
GRADIENT_TOLERANCE, NDCG_TOLERANCE = {"cpu": 1e-6, "cuda": 1e-5}, 0.01


def _launch(processes: int, out: Path, data_dir: Path, device: str) -> None:
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=processes, run_id=str(uuid.uuid4()), rdzv_backend="c10d",
        rdzv_endpoint="localhost:0", max_restarts=0, start_method="spawn", monitor_interval=0.1,
    )  # fmt: skip
    elastic_launch(config, train_and_save)(str(data_dir), str(out), device)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_two_processes_train_as_one_and_evaluate_it_exactly(tiny_data_dir: Path, tmp_path: Path, device: str) -> None:
    if device == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA devices for NCCL, this machine has {torch.cuda.device_count()}")
    train_and_save(str(tiny_data_dir), str(tmp_path / "one.pt"), device)
    _launch(2, tmp_path / "two.pt", tiny_data_dir, device)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")

    # a step: each process's share of the batch, weighted by its targets and averaged by DDP, is the whole batch's
    for name, gradient in one["gradients"].items():
        torch.testing.assert_close(two["gradients"][name], gradient, rtol=0, atol=GRADIENT_TOLERANCE[device], msg=name)
    # two epochs: Adam turns the sums' rounding into differences of up to ~lr per step on the weights it barely moves,
    # so the models are compared by what they rank
    assert two["best_valid"]["ndcg@10"] == pytest.approx(one["best_valid"]["ndcg@10"], abs=NDCG_TOLERANCE)
    assert two["metrics"]["ndcg@10"] == pytest.approx(one["metrics"]["ndcg@10"], abs=NDCG_TOLERANCE)
    # the two processes' split evaluation of their model is the single process's evaluation of it, rank for rank
    data = load_prepared(tiny_data_dir)
    model = small_sasrec(data.num_items)
    model.load_state_dict(two["weights"])
    model.to(device).eval()
    alone = evaluate(model, data.eval_split("test"), data.num_items, EVAL)
    if device == "cpu":
        assert torch.equal(two["ranks"], alone.ranks)
        assert two["metrics"] == alone.metrics
    else:  # a GPU may pick other matmul kernels for other batch shapes: a score's last bit can differ
        assert (two["ranks"] == alone.ranks).float().mean() > 0.99
        assert two["metrics"]["ndcg@10"] == pytest.approx(alone.metrics["ndcg@10"], abs=1e-3)


def test_each_process_takes_every_world_size_th_row() -> None:
    batch = HistoryBatch(torch.arange(10).view(5, 2), torch.arange(5), torch.arange(5))
    shares = [share_of_rows(batch, Workers(rank, 2)) for rank in range(2)]

    assert [share.targets.tolist() for share, _ in shares] == [[0, 2, 4], [1, 3]]
    assert all(has_rows for _, has_rows in shares)
    few, has_rows = share_of_rows(HistoryBatch(torch.ones(1, 2), torch.ones(1), torch.ones(1)), Workers(1, 2))
    assert not has_rows and len(few.targets) == 1  # a row to run the step on, weighed 0


def test_the_launcher_environment_is_read_and_checked() -> None:
    assert Workers.from_environment({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == Workers(1, 2, 1)
    with pytest.raises(ConfigError, match="RANK=2, WORLD_SIZE=2"):
        Workers.from_environment({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="not numeric"):
        Workers.from_environment({"RANK": "x", "WORLD_SIZE": "2"})
