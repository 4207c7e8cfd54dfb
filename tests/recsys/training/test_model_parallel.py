"""torchrec DMP for the two-tower's tables, on real gloo process groups started by torch's elastic launcher: two
processes with the tables sharded table-wise make the updates one unsharded process makes; the plan, the refusals,
and what the planner offers on CPU and on CUDA."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipelines.launcher import run_on_processes
from recsys.errors import ConfigError
from recsys.models.two_tower import TwoTower, TwoTowerConfig
from recsys.modules.table_training import TableTraining
from recsys.training.config import OptimizationConfig
from recsys.training.model_parallel import (
    check_sharding,
    placements,
    plan_tables,
    require_cuda_fbgemm,
    table_training,
)
from tests.recsys.training.model_parallel_steps import (
    WORLD_SIZE,
    fit_straight_and_resumed,
    train_sharded,
    train_unsharded,
)

# docs/distributed.md states it: after 4 steps (Adam on the dense part, SGD on the tables), losses and weights equal up
# to float sums
TOLERANCE = 1e-5


def test_two_sharded_processes_train_as_one_unsharded() -> None:
    sharded = run_on_processes(WORLD_SIZE, train_sharded)
    losses, weights = train_unsharded()

    torch.testing.assert_close(sharded[0]["losses"], losses, rtol=0, atol=TOLERANCE)
    for rank in range(WORLD_SIZE):  # every process gathers the same whole tables, those of one process
        for name, tensor in weights.items():
            torch.testing.assert_close(sharded[rank]["last"][name], tensor, rtol=0, atol=TOLERANCE, msg=name)
    # a copy of the sharded state (the trainer's best weights) loads back into the shards
    first, reloaded = sharded[0]["after_first"], sharded[0]["reloaded"]
    assert all(torch.equal(reloaded[name], first[name]) for name in first)
    # the steps after the first moved every table: two frozen models would compare equal too
    tables = [name for name in weights if name.endswith(".weight") and ".bags." in name]
    assert len(tables) == 4 and all(not torch.equal(first[name], weights[name]) for name in tables)
    # made plain again at the end, every process holds the whole model and scores alone what one process scores
    for rank in range(WORLD_SIZE):
        assert all(torch.equal(sharded[rank]["unsharded"][name], first[name]) for name in first)
        torch.testing.assert_close(sharded[rank]["item_vectors"], sharded[0]["item_vectors"], rtol=0, atol=0)
    # the plan: each table whole on one process, the four spread over both
    placed = sharded[0]["placements"]
    assert {table.table for table in placed} == {"history", "recent", "user", "item_id"}
    assert {table.sharding for table in placed} == {"table_wise"} and {table.kernel for table in placed} == {"fused"}
    assert all(len(table.ranks) == 1 for table in placed)
    assert {table.ranks[0] for table in placed} == {0, 1}


def test_the_planner_offers_rows_on_cuda_and_whole_tables_on_cpu() -> None:
    config = TwoTowerConfig(num_items=100, user_tower="pooled", dim=8, user_buckets=5, shard_tables="table_wise")
    model = TwoTower(config)
    on_gpus = placements(plan_tables(model, "row_wise", world_size=2, compute_device="cuda"))
    assert {(t.sharding, t.ranks) for t in on_gpus} == {("row_wise", (0, 1))} and len(on_gpus) == 4
    on_cpus = placements(plan_tables(model, "table_wise", world_size=2, compute_device="cpu"))
    assert {t.sharding for t in on_cpus} == {"table_wise"} and {t.ranks for t in on_cpus} == {(0,), (1,)}
    with pytest.raises(RuntimeError, match="No available sharding type"):  # torchrec's own refusal, before ours
        plan_tables(model, "row_wise", world_size=2, compute_device="cpu")


def test_what_cpu_processes_cannot_shard_or_fuse_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"Fix: model\.shard_tables=table_wise on CPU processes"):
        check_sharding(TableTraining("row_wise"), torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"fuse rowwise_adagrad, adagrad, sgd only\. Fix: model\.table_optimizer"):
        check_sharding(TableTraining("table_wise", "adam"), torch.device("cpu"))
    check_sharding(TableTraining("table_wise"), torch.device("cpu"))


def test_the_model_asks_for_its_tables_and_the_run_must_allow_the_fused_update() -> None:
    config = TwoTowerConfig(num_items=10, dim=4, shard_tables="table_wise", table_optimizer="sgd", table_lr=0.1)
    assert table_training(TwoTower(TwoTowerConfig(num_items=10, dim=4)), OptimizationConfig()) is None
    assert table_training(TwoTower(config), OptimizationConfig()) == TableTraining("table_wise", "sgd", 0.1)
    with pytest.raises(
        ConfigError,
        match=r"Fix: set train\.optimization\.lr_schedule: constant, train\.optimization\.accumulate_batches: 1, or",
    ):
        table_training(TwoTower(config), OptimizationConfig(lr_schedule="cosine", accumulate_batches=2))


@pytest.mark.gpu
def test_a_gpu_without_fbgemm_cuda_build_is_told_how_to_install_it() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    try:
        require_cuda_fbgemm()
    except ConfigError as err:  # the CPU build on a GPU machine: the message names the fix
        assert "pip install -e '.[cuda]'" in str(err) and "make setup" in str(err)


def test_a_sharded_run_resumes_with_its_tables_optimizer_state(tiny_data_dir: Path, tmp_path: Path) -> None:
    runs = run_on_processes(WORLD_SIZE, fit_straight_and_resumed, str(tiny_data_dir), str(tmp_path / "state.dcp"))[0]
    # epoch 2 from the saved state (weights, Adam's moments, the fused Adagrad's accumulators) is epoch 2 of the
    # straight run: without the accumulators the tables' steps would be larger and the weights would differ
    for name, tensor in runs["straight"].items():
        torch.testing.assert_close(runs["resumed"][name], tensor, rtol=0, atol=1e-6, msg=name)


# A model with no torchrec tables goes through the trainer's table hooks without torchrec: a GPU host may lack the CUDA
# fbgemm build that torchrec needs, and SASRec / HSTU do not use it
NO_TORCHREC = """
import sys
sys.modules["torchrec"] = None  # any import of it raises ImportError
from recsys.models.registry import build_model
from recsys.training.model_parallel import fused_table_parameters, gathered_tables, unshard_tables
model = build_model("sasrec", {"max_history": 8, "dim": 8, "num_layers": 1, "num_heads": 1}, 20)
with gathered_tables(model):
    pass
unshard_tables(model)
assert fused_table_parameters(model) == []
print("ok")
"""


def test_models_without_tables_need_no_torchrec() -> None:
    done = subprocess.run([sys.executable, "-c", NO_TORCHREC], capture_output=True, text=True, timeout=120, check=False)

    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
