"""Data-parallel training on real gloo process groups started by torch's elastic launcher: two processes train the
model one process trains, and their split evaluation gives the single process's metrics exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from features.prepare import prepare
from features.settings import PrepareSettings
from features.sources import load_source
from pipelines.launcher import run_on_processes
from recsys.data.batching import HistoryBatch
from recsys.data.prepared import PreparedParts, TrainingData, load_prepared
from recsys.errors import ConfigError
from recsys.evaluation import evaluate
from recsys.runtime.distributed import Workers
from recsys.training.data_parallel import Share, _table_read_by_ids, epoch_batches, share_of_rows
from recsys.training.recipes import NextItemTraining, recipe_for
from tests.recsys.training.distributed_fit import (
    EVAL,
    SAMPLED,
    compiled_generative_step_gradients,
    generative_step_gradients,
    host_sums_and_a_sharded_step,
    recipe_of,
    reduce_touched_rows,
    small_sasrec,
    train_and_save,
    train_resumably,
    train_sampled_replicated,
    train_sharded,
)

# docs/distributed.md states them: gradients equal up to float sums; after two epochs, the metrics within 0.01
GRADIENT_TOLERANCE, NDCG_TOLERANCE = {"cpu": 1e-6, "cuda": 1e-5}, 0.01


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_two_processes_train_as_one_and_evaluate_it_exactly(tiny_data_dir: Path, tmp_path: Path, device: str) -> None:
    if device == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA devices for NCCL, this machine has {torch.cuda.device_count()}")
    train_and_save(str(tiny_data_dir), str(tmp_path / "one.pt"), device)
    run_on_processes(2, train_and_save, str(tiny_data_dir), str(tmp_path / "two.pt"), device)
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


def _epoch_of_each_process(data: TrainingData, processes: int) -> tuple[list[list[Share]], list[torch.Tensor]]:
    """`epoch_batches` of every process of a run of `processes` (in this process: nothing is exchanged, each keeps
    its own step count), and the data generator's state after each."""
    recipe = recipe_for(small_sasrec(data.num_items), data, 8, NextItemTraining(loss="full_softmax"))
    epochs, states = [], []
    for rank in range(processes):
        generator = torch.Generator().manual_seed(5)
        epochs.append(list(epoch_batches(data, recipe, generator, Workers(rank, processes))))
        states.append(generator.get_state())
    return epochs, states


def _targets(batches: list[Share]) -> list[int]:
    return sorted(int(t) for share in batches if share.has_rows for t in share.batch.targets.flatten() if t != 0)


@pytest.mark.parametrize("partitioned", [False, True])
def test_each_process_reads_and_packs_its_own_users_of_an_epoch(
    tiny_data_dir: Path, tmp_path: Path, partitioned: bool
) -> None:
    if partitioned:  # 4 parts, a shuffle buffer of 2: each process reads one part of each buffer
        prepare(load_source("synthetic", None, seed=0, num_users=300, num_items=150), tmp_path / "parts",
                PrepareSettings(partitions=4))  # fmt: skip
        data: TrainingData = PreparedParts.open(tmp_path / "parts", buffer_parts=2)
    else:  # in memory: every second user
        data = load_prepared(tiny_data_dir)
    (alone,), _ = _epoch_of_each_process(data, 1)
    shares, states = _epoch_of_each_process(data, 2)

    assert all(not isinstance(batch, Share) for batch in alone)  # one process packs whole batches
    assert all(isinstance(share, Share) and len(share.batch.targets) <= 4 for share in shares[0] + shares[1])
    # together the processes train on the epoch's targets, each once: every user's, in one process or the other
    assert sorted(_targets(shares[0]) + _targets(shares[1])) == sorted(
        int(t) for batch in alone for t in batch.targets.flatten() if t != 0
    )
    assert torch.equal(states[0], states[1])  # the data's generator advanced alike, whatever each packed


def test_the_launcher_environment_is_read_and_checked() -> None:
    assert Workers.from_environment({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}) == Workers(1, 2, 1)
    with pytest.raises(ConfigError, match="RANK=2, WORLD_SIZE=2"):
        Workers.from_environment({"RANK": "2", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="not numeric"):
        Workers.from_environment({"RANK": "x", "WORLD_SIZE": "2"})


def test_a_state_saved_by_two_processes_resumes_on_one(tiny_data_dir: Path, tmp_path: Path) -> None:
    state = tmp_path / "state.dcp"
    run_on_processes(2, train_resumably, str(tiny_data_dir), str(state), str(tmp_path / "two.pt"), 1)
    two = torch.load(tmp_path / "two.pt")
    assert two["trained"] == [1]
    assert {path.name for path in state.glob("*.distcp")} == {"__0_0.distcp", "__1_0.distcp"}  # each wrote its part

    train_resumably(str(tiny_data_dir), str(state), str(tmp_path / "one.pt"), epochs=1)  # finished: loads, trains none
    one = torch.load(tmp_path / "one.pt")
    assert one["trained"] == []
    for name, tensor in two["weights"].items():
        assert torch.equal(one["weights"][name], tensor), name
    train_resumably(str(tiny_data_dir), str(state), str(tmp_path / "one.pt"), epochs=2)
    assert torch.load(tmp_path / "one.pt")["trained"] == [2]  # on from where the two processes stopped


def _paths(data_dir: Path, tmp_path: Path, run: str) -> tuple[str, str, str]:
    """`train_resumably`'s data directory, training state and output of a run called `run`."""
    return str(data_dir), str(tmp_path / f"{run}.dcp"), str(tmp_path / f"{run}.pt")


def test_a_killed_process_is_restarted_by_the_launcher_and_the_run_loses_nothing(
    tiny_data_dir: Path, tmp_path: Path
) -> None:
    run_on_processes(2, train_resumably, *_paths(tiny_data_dir, tmp_path, "straight"), 2)
    data = load_prepared(tiny_data_dir)
    generator = torch.Generator().manual_seed(0)
    recipe = recipe_of(small_sasrec(data.num_items), data)
    batches = sum(len(recipe.batches(rows, generator)) for rows in data.training_epoch(generator))

    # the last process dies in the middle of epoch 2; the launcher restarts both, which resume after epoch 1
    killed_at = batches + batches // 2
    run_on_processes(2, train_resumably, *_paths(tiny_data_dir, tmp_path, "killed"), 2, killed_at, max_restarts=1)
    straight, killed = torch.load(tmp_path / "straight.pt"), torch.load(tmp_path / "killed.pt")
    assert killed["trained"] == [2]  # the restarted processes' run: epoch 1 came from the state
    for name, tensor in straight["weights"].items():
        assert torch.equal(killed["weights"][name], tensor), name


def test_an_item_table_split_by_rows_over_two_processes_trains_as_one_table(
    tiny_data_dir: Path, tmp_path: Path
) -> None:
    train_sharded(str(tiny_data_dir), str(tmp_path / "one.pt"))  # one process: the table stays whole
    run_on_processes(2, train_sharded, str(tiny_data_dir), str(tmp_path / "two.pt"))
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")

    rows = one["weights"]["item_emb.weight"].shape[0]
    assert two["held"] == [(rows + 1) // 2, rows // 2]  # each process holds its block of rows, not the table
    # a step: the blocks' gradients, gathered, and the averaged others are the whole batch's on one table
    for name, gradient in one["gradients"].items():
        torch.testing.assert_close(two["gradients"][name], gradient, rtol=0, atol=GRADIENT_TOLERANCE["cpu"], msg=name)
    assert two["best_valid"]["ndcg@10"] == pytest.approx(one["best_valid"]["ndcg@10"], abs=NDCG_TOLERANCE)
    trained = two["weights"]["item_emb.weight"]  # the trained model is whole again, to write and serve
    assert type(trained) is torch.Tensor and trained.shape == one["weights"]["item_emb.weight"].shape


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_replicated_item_table_averaged_by_the_rows_each_step_touched_trains_as_one_table(
    tiny_data_dir: Path, tmp_path: Path, device: str
) -> None:
    if device == "cuda" and torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA devices for NCCL, this machine has {torch.cuda.device_count()}")
    data = load_prepared(tiny_data_dir)
    model = small_sasrec(data.num_items)
    assert _table_read_by_ids(model, recipe_of(model, data, SAMPLED)) is model.item_emb.weight  # averaged apart
    assert _table_read_by_ids(model, recipe_of(model, data)) is None  # the full softmax: every row, in DDP
    train_sampled_replicated(str(tiny_data_dir), str(tmp_path / "one.pt"), device)
    run_on_processes(2, train_sampled_replicated, str(tiny_data_dir), str(tmp_path / "two.pt"), device)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")

    # a step: the table's gradient gathered by rows and averaged, the rest by DDP, is the whole batch's
    assert set(two["gradients"]) == set(one["gradients"])
    for name, gradient in one["gradients"].items():
        torch.testing.assert_close(two["gradients"][name], gradient, rtol=0, atol=GRADIENT_TOLERANCE[device], msg=name)
    # two epochs of two batches an update (no_sync between them: the rows of both are averaged once)
    assert two["best_valid"]["ndcg@10"] == pytest.approx(one["best_valid"]["ndcg@10"], abs=NDCG_TOLERANCE)


@pytest.mark.parametrize(
    ("dense_above", "expected_rows", "refused"),
    [
        (0.0, 1, False),  # whole: an all-reduce needs no bound
        (2.0, 3, False),  # by rows, each process's 3 rows expected
        (2.0, 1, True),  # by rows, 1 row expected where 3 were touched: rows dropped, and the check says so
        (0.3, 1, True),  # the default: 2 rows gathered of 10, by rows
        (0.3, 3, False),  # 6 of 10 gathered: above 0.3 of the table, whole
    ],
)
def test_the_table_gradient_is_averaged_by_rows_up_to_its_share_of_the_table_and_whole_above(
    tmp_path: Path, dense_above: float, expected_rows: int, refused: bool
) -> None:
    run_on_processes(2, reduce_touched_rows, str(tmp_path / "two.pt"), dense_above, expected_rows)
    two = torch.load(tmp_path / "two.pt")

    assert two["refused"] is refused
    if not refused:  # DDP's average: rows 0, 3, 5 weighted 1 on one process, 1, 4, 6 weighted 2 on the other
        expected = torch.zeros(10, 4)
        expected[[0, 3, 5]] = 0.5
        expected[[1, 4, 6]] = 1.0
        torch.testing.assert_close(two["gradient"], expected, rtol=0, atol=0)


def test_integers_are_reduced_on_the_hosts_and_a_split_table_step_allocates_no_whole_table(
    tiny_data_dir: Path, tmp_path: Path
) -> None:
    run_on_processes(2, host_sums_and_a_sharded_step, str(tiny_data_dir), str(tmp_path / "two.pt"))
    two = torch.load(tmp_path / "two.pt")

    assert two["sums"] == [3, 10] and two["largest"] == [4, 0]
    # the table is 20,001 x 32 fp32 (2.56 MB), each process's block half of it. The lookup's backward adds into the
    # block's gradient; RowwiseParallel's built the whole table's on every process (a 2.56 MB tensor per lookup)
    whole_table = 20_001 * 32 * 4
    assert two["largest_allocation"] < 0.6 * whole_table


def test_two_processes_train_the_generative_loss_compiled_inside_ddp_as_one_eager_process(tmp_path: Path) -> None:
    """The trainer compiles the generative recipe's loss with the forward (`DataParallelLoss.compile`) in place, inside
    DDP: under gloo the two processes' compiled step gives the gradients of one eager process on the whole batch."""
    graphs = run_on_processes(2, compiled_generative_step_gradients, str(tmp_path / "two.pt"))
    assert all(count >= 1 for count in graphs.values()), f"no graph compiled on some process: {graphs}"
    two = torch.load(tmp_path / "two.pt")
    alone = generative_step_gradients(Workers(), compiled=False)
    assert two.keys() == alone.keys()
    for name, gradient in alone.items():
        torch.testing.assert_close(two[name], gradient, rtol=0, atol=1e-6, msg=name)
