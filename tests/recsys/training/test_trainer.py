"""Training on the tiny synthetic data: it learns, stops early, and keeps the best validation epoch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from features.prepare import prepare
from features.settings import PrepareSettings
from features.sources import load_source
from recsys.data.jagged import Jagged
from recsys.data.prepared import PreparedParts, load_prepared
from recsys.errors import BudgetExceeded, ConfigError, TrainingDiverged
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.runtime.distributed import Workers
from recsys.training.config import HardwareConfig, OptimizationConfig, ScheduleConfig, TrainConfig
from recsys.training.data_parallel import DataParallelLoss
from recsys.training.optimization import Optimization, build_optimization
from recsys.training.recipes import NextItemTraining, recipe_for
from recsys.training.trainer import fit, train_one_epoch
from tests.conftest import popularity_valid_metric, quick_train

EVAL = EvalConfig(ks=(10,))


def small_sasrec(num_items: int) -> SASRec:
    torch.manual_seed(0)  # the same initial weights every time
    return SASRec(SASRecConfig(num_items=num_items, max_history=20, dim=32, num_heads=1, ffn_dim=64, dropout=0.1))


@pytest.mark.parametrize(
    ("loss", "sparse", "in_batch"),
    [
        ("full_softmax", False, False),
        ("sampled_softmax", False, False),
        ("sampled_softmax", False, True),
        ("sampled_softmax", True, True),
    ],
)
def test_sasrec_beats_popularity_and_restores_its_best_epoch(
    tiny_data_dir: Path, loss: str, sparse: bool, in_batch: bool
) -> None:
    data = load_prepared(tiny_data_dir)
    model = small_sasrec(data.num_items)
    seen: list[int] = []
    config = quick_train(8, 4, 3e-3)
    settings = NextItemTraining(
        loss=loss,  # type: ignore[arg-type]
        num_negatives=64,
        sparse_item_gradients=sparse,
        in_batch_negatives=in_batch,
    )
    recipe = recipe_for(model, data, config.optimization.batch_size, settings)
    result = fit(model, data, config, EVAL, recipe, on_epoch_end=lambda epoch, _: seen.append(epoch))

    assert seen == list(range(1, len(seen) + 1))
    valid = evaluate(model, data.eval_split("valid"), data.num_items, EVAL).metrics["ndcg@10"]
    assert valid == pytest.approx(result.best_valid["ndcg@10"]), "the best epoch's weights were not restored"
    baseline = popularity_valid_metric(data, EVAL)
    assert valid > 1.5 * baseline > 0


def test_early_stopping_after_patience(tiny_data_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)
    model = small_sasrec(data.num_items)
    # lr 0 never improves after epoch 1, so training stops after 1 + patience epochs
    config = TrainConfig(
        schedule=ScheduleConfig(epochs=20, patience=2),
        optimization=OptimizationConfig(batch_size=8, lr=0.0),
        progress=False,
    )
    result = fit(model, data, config, EVAL)
    assert result.best_epoch == 1
    assert len(result.epoch_seconds) == 3
    assert result.seconds_per_epoch > 0


def poisoned(model: SASRec) -> None:
    """What a blow-up leaves: NaN item vectors, so every later loss is NaN."""
    assert model.item_emb is not None
    with torch.no_grad():
        model.item_emb.weight[1:] = float("nan")


def test_a_diverged_epoch_ends_the_run_with_the_best_validated_weights(
    tiny_data_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = load_prepared(tiny_data_dir)
    config = TrainConfig(
        schedule=ScheduleConfig(epochs=6), optimization=OptimizationConfig(batch_size=8, lr=3e-3), progress=False
    )
    model, state = small_sasrec(data.num_items), tmp_path / "state.dcp"

    def poison_after_epoch_2(epoch: int, _: dict[str, float]) -> None:
        if epoch == 2:
            poisoned(model)

    with caplog.at_level("ERROR", logger="recsys.training.trainer"):
        result = fit(model, data, config, EVAL, on_epoch_end=poison_after_epoch_2, state_path=state)
    assert result.diverged_epoch == 3 and len(result.epoch_seconds) == 3, "training went on after a NaN loss"
    assert result.best_epoch in (1, 2)
    assert all(torch.isfinite(t).all() for t in model.state_dict().values()), "the diverged weights were kept"
    valid = evaluate(model, data.eval_split("valid"), data.num_items, EVAL).metrics["ndcg@10"]
    assert valid == pytest.approx(result.best_valid["ndcg@10"]) and valid > 0
    assert "epoch 3's mean loss is nan" in caplog.text and "train.optimization.lr (now 0.003)" in caplog.text

    seen: list[int] = []
    again = small_sasrec(data.num_items)
    rerun = fit(again, data, config, EVAL, on_epoch_end=lambda epoch, _: seen.append(epoch), state_path=state)
    assert seen == [] and rerun.diverged_epoch == 3, "a re-run of a diverged run trained again"
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], tensor, msg=f"{name} differs in the re-run")


# without a validated start, or with one whose weights are NaN already: nothing finite to keep
@pytest.mark.parametrize("validate_initial", [False, True])
def test_a_run_with_no_finite_validated_weights_to_keep_fails_with_the_fix(
    tiny_data_dir: Path, validate_initial: bool
) -> None:
    data = load_prepared(tiny_data_dir)
    model = small_sasrec(data.num_items)
    poisoned(model)
    config = TrainConfig(
        schedule=ScheduleConfig(epochs=3, validate_initial=validate_initial),
        optimization=OptimizationConfig(batch_size=8), progress=False,
    )  # fmt: skip
    with pytest.raises(TrainingDiverged, match=r"epoch 1's mean loss is nan.*Fix: lower train.optimization.lr"):
        fit(model, data, config, EVAL)


def test_a_validated_start_is_kept_when_the_first_epoch_diverges(tiny_data_dir: Path) -> None:
    """validate_initial: the start is a model the run keeps unless an epoch beats it (a residual ranker's retriever
    order), so a first epoch that diverges leaves it, as trained nothing."""
    data = load_prepared(tiny_data_dir)
    model, start = small_sasrec(data.num_items), small_sasrec(data.num_items).state_dict()
    config = TrainConfig(
        schedule=ScheduleConfig(epochs=3, validate_initial=True),
        optimization=OptimizationConfig(batch_size=8, lr=3e-3), progress=False,
    )  # fmt: skip

    def poison_after_the_start(epoch: int, _: dict[str, float]) -> None:
        if epoch == 0:
            poisoned(model)

    result = fit(model, data, config, EVAL, on_epoch_end=poison_after_the_start)
    assert result.best_epoch == 0 and result.diverged_epoch == 1
    for name, tensor in start.items():
        torch.testing.assert_close(model.state_dict()[name], tensor, msg=f"{name} is not the start's")


def test_unknown_monitor_fails_before_training(tiny_data_dir: Path) -> None:
    from recsys.errors import ConfigError

    data = load_prepared(tiny_data_dir)
    with pytest.raises(ConfigError, match=r"train.schedule.monitor 'ndcg@20' is not computed"):
        fit(
            small_sasrec(data.num_items),
            data,
            TrainConfig(schedule=ScheduleConfig(monitor="ndcg@20"), progress=False),
            EVAL,
        )


@pytest.mark.parametrize("ema_decay", [0.0, 0.9])
def test_an_interrupted_run_resumes_to_the_same_weights(tiny_data_dir: Path, tmp_path: Path, ema_decay: float) -> None:
    data = load_prepared(tiny_data_dir)
    config = TrainConfig(
        schedule=ScheduleConfig(epochs=3),
        optimization=OptimizationConfig(
            batch_size=8, lr=3e-3, lr_schedule="cosine", warmup_steps=2, ema_decay=ema_decay
        ),
        progress=False,
    )
    straight = small_sasrec(data.num_items)
    fit(straight, data, config, EVAL)

    def epochs_trained(model: SASRec, cfg: TrainConfig) -> list[int]:
        seen: list[int] = []
        fit(model, data, cfg, EVAL, on_epoch_end=lambda epoch, _: seen.append(epoch), state_path=state)
        return seen

    state = tmp_path / "state.dcp"
    # a time budget of 0 s stops after the first epoch, as a crash after its checkpoint would
    assert epochs_trained(
        small_sasrec(data.num_items),
        dataclasses.replace(config, schedule=dataclasses.replace(config.schedule, max_seconds=0.0)),
    ) == [1]
    fresh = small_sasrec(data.num_items)
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)  # a new process with other weights: only the saved state can make it match
    assert epochs_trained(fresh, config) == [2, 3]
    for name, tensor in straight.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[name], tensor, msg=f"{name} differs after resuming")

    assert epochs_trained(small_sasrec(data.num_items), config) == []  # finished: a re-run trains nothing
    values = data.sequences.values.clone()
    values[[0, 1]] = values[[1, 0]]  # one user's first two items swapped: other data of the same shape
    data = dataclasses.replace(data, sequences=Jagged(values, data.sequences.offsets))
    assert epochs_trained(small_sasrec(data.num_items), config) == [1, 2, 3]  # new data trains afresh

    def with_frozen_positions(shift: float) -> SASRec:  # a part the run does not train, as a ranker's first stage
        model = small_sasrec(data.num_items)
        model.pos_emb.weight.requires_grad_(False).add_(shift)
        return model

    assert epochs_trained(with_frozen_positions(0.0), config) == [1, 2, 3]
    assert epochs_trained(with_frozen_positions(0.0), config) == []
    assert epochs_trained(with_frozen_positions(0.5), config) == [1, 2, 3]  # another frozen part: not this run
    other = dataclasses.replace(
        config, optimization=dataclasses.replace(config.optimization, lr=1e-2)
    )  # other settings: the saved state is not theirs
    assert epochs_trained(small_sasrec(data.num_items), other) == [1, 2, 3]


def test_weight_average_tracks_an_exponential_average_and_swaps_it_in_only_inside_the_block() -> None:
    from recsys.training.averaging import WeightAverage

    layer = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(0.0)
    average = WeightAverage(layer, decay=0.5)
    expected = 0.0
    for step, value in enumerate([4.0, 8.0, 2.0]):
        with torch.no_grad():
            layer.weight.fill_(value)
        average.update()
        decay = min(0.5, (1 + step) / (10 + step))  # warm-up: 0.1, 0.18..., then capped at 0.5
        expected = decay * expected + (1 - decay) * value
    with average.applied():
        assert layer.weight.item() == pytest.approx(expected)
    assert layer.weight.item() == 2.0, "the model's own weights were not restored after the block"


def test_with_ema_the_validated_and_restored_weights_are_the_average(tiny_data_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)
    model = small_sasrec(data.num_items)
    config = TrainConfig(
        schedule=ScheduleConfig(epochs=4),
        optimization=OptimizationConfig(batch_size=4, lr=3e-3, ema_decay=0.99),
        progress=False,
    )
    result = fit(model, data, config, EVAL)
    valid = evaluate(model, data.eval_split("valid"), data.num_items, EVAL).metrics["ndcg@10"]
    assert valid == pytest.approx(result.best_valid["ndcg@10"]), "the model does not hold the validated EMA weights"
    last = small_sasrec(data.num_items)
    fit(
        last,
        data,
        dataclasses.replace(config, optimization=dataclasses.replace(config.optimization, ema_decay=0.0)),
        EVAL,
    )
    assert any(not torch.equal(a, b) for a, b in zip(model.parameters(), last.parameters(), strict=True))


def test_a_validation_sample_picks_the_epoch_and_the_checkpoint_is_validated_on_everyone(
    tiny_data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = load_prepared(tiny_data_dir)
    seen: list[dict[str, float]] = []
    config = TrainConfig(
        schedule=ScheduleConfig(epochs=3, valid_users=50),
        optimization=OptimizationConfig(batch_size=8, lr=3e-3),
        progress=False,
    )
    model = small_sasrec(data.num_items)
    with caplog.at_level("INFO", logger="recsys.training.trainer"):
        result = fit(model, data, config, EVAL, on_epoch_end=lambda _, m: seen.append(m))
    assert all(m["valid_sample_users"] == 50 for m in seen)  # every epoch says it was a sample
    assert "validating each epoch on 50 of 300 users" in caplog.text
    full = evaluate(model, data.eval_split("valid"), data.num_items, EVAL).metrics["ndcg@10"]
    assert result.best_valid["ndcg@10"] == pytest.approx(full) and "valid_sample_users" not in result.best_valid
    assert full != seen[result.best_epoch - 1]["ndcg@10"]  # 50 users and 300 rank differently


def test_streamed_parts_train_deterministically_and_resume(tmp_path: Path) -> None:
    data_dir = tmp_path / "parted"
    prepare(load_source("synthetic", None, num_users=300, num_items=150), data_dir, PrepareSettings(partitions=4))
    config = TrainConfig(
        schedule=ScheduleConfig(epochs=3, valid_users=60),
        optimization=OptimizationConfig(batch_size=8, lr=3e-3),
        progress=False,
    )
    parts = PreparedParts.open(data_dir, buffer_parts=2)

    def trained(state: Path | None = None, epochs: int = 3) -> tuple[SASRec, float]:
        model = small_sasrec(parts.num_items)
        result = fit(
            model,
            parts,
            dataclasses.replace(config, schedule=dataclasses.replace(config.schedule, epochs=epochs)),
            EVAL,
            state_path=state,
        )
        return model, result.best_valid["ndcg@10"]

    first, valid = trained()
    second, _ = trained()
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters(), strict=True))
    whole = load_prepared(data_dir)
    assert valid == pytest.approx(evaluate(first, whole.eval_split("valid"), whole.num_items, EVAL).metrics["ndcg@10"])
    assert valid > 1.5 * popularity_valid_metric(whole, EVAL) > 0
    state = tmp_path / "state.dcp"
    trained(state, epochs=1)  # stops after epoch 1; the rerun resumes there
    resumed, _ = trained(state)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), resumed.parameters(), strict=True))


def test_auto_loss_follows_the_catalogue_size() -> None:
    settings = NextItemTraining()
    assert settings.resolved_loss(12_101) == "full_softmax"
    assert settings.resolved_loss(1_000_000) == "sampled_softmax"
    with pytest.raises(ConfigError, match=r"needs the sampled softmax.*Fix: set loss: sampled_softmax"):
        NextItemTraining(sparse_item_gradients=True).resolved_loss(12_101)
    with pytest.raises(ConfigError, match=r"needs the full softmax.*Fix: set loss: full_softmax"):
        NextItemTraining(softmax_within_domain=True).resolved_loss(1_000_000)


def test_a_memory_budget_stops_training_with_the_knob_named_and_progress_is_logged(
    tiny_data_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    data = load_prepared(tiny_data_dir)
    monkeypatch.setattr("recsys.runtime.progress.EVERY_SECONDS", 0.0)
    with caplog.at_level("INFO", logger="recsys.training.trainer"):
        fit(
            small_sasrec(data.num_items),
            data,
            TrainConfig(
                schedule=ScheduleConfig(epochs=1), optimization=OptimizationConfig(batch_size=8), progress=False
            ),
            EVAL,
        )
    assert "training epoch 1/1: " in caplog.text and "targets/s" in caplog.text
    config = TrainConfig(
        schedule=ScheduleConfig(epochs=1),
        optimization=OptimizationConfig(batch_size=8),
        hardware=HardwareConfig(max_memory_gb=0.01),
        progress=False,
    )
    with pytest.raises(
        BudgetExceeded, match=r"training: holds .* GiB .*after 1 steps.*Fix: raise train\.hardware\.max_memory_gb"
    ):
        fit(small_sasrec(data.num_items), data, config, EVAL)


def test_each_epoch_says_its_number_its_batches_and_the_eta_of_the_epoch_and_at_most_of_the_run(
    tiny_data_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    data = load_prepared(tiny_data_dir)
    monkeypatch.setattr("recsys.runtime.progress.EVERY_SECONDS", 0.0)  # a line per batch
    config = TrainConfig(schedule=ScheduleConfig(epochs=3), optimization=OptimizationConfig(batch_size=8))
    with caplog.at_level("INFO", logger="recsys.training.trainer"):
        fit(small_sasrec(data.num_items), data, config, EVAL)
    first = [m for m in caplog.messages if m.startswith("training epoch 1/3: ") and "done" not in m]
    second = [m for m in caplog.messages if m.startswith("training epoch 2/3: ") and "done" not in m]
    last = [m for m in caplog.messages if m.startswith("training epoch 3/3: ") and "done" not in m]
    batches = len(first)  # the first epoch counts its batches: no total, no ETA yet
    assert first[-1].startswith(f"training epoch 1/3: {batches} batches, ") and "ETA" not in first[-1]
    assert second[0].startswith(f"training epoch 2/3: 1 of {batches} batches (") and "targets/s, ETA " in second[0]
    assert second[0].endswith(" (early stopping may end it sooner)") and "; training at most " in second[0]
    assert "ETA 0 s; training at most " in second[-1]  # the rest of the run: one epoch and two validations
    assert last[-1].startswith(f"training epoch 3/3: {batches} of {batches} batches (100%), ")
    assert any(m.startswith("epoch 3/3 loss ") for m in caplog.messages)


def test_one_cpu_thread_trains_bit_for_bit_the_same(tiny_data_dir: Path) -> None:
    """Two threads split reductions in an order that varies from run to run; one thread reproduces a run exactly."""
    data = load_prepared(tiny_data_dir)
    config = TrainConfig(
        schedule=ScheduleConfig(epochs=2),
        optimization=OptimizationConfig(batch_size=8),
        hardware=HardwareConfig(device="cpu", threads=1),
        progress=False,
    )
    first, second = small_sasrec(data.num_items), small_sasrec(data.num_items)
    threads = torch.get_num_threads()
    try:
        fit(first, data, config, EVAL)
        fit(second, data, config, EVAL)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters(), strict=True))


def test_accumulated_batches_step_once_on_the_mean_of_their_losses(tiny_data_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)

    def no_dropout() -> SASRec:  # the same forward in both
        torch.manual_seed(0)
        config = SASRecConfig(num_items=data.num_items, max_history=20, dim=32, num_heads=1, ffn_dim=64, dropout=0.0,
                              attn_dropout=0.0)  # fmt: skip
        return SASRec(config)

    accumulated, reference = no_dropout(), no_dropout()
    recipe = recipe_for(accumulated, data, 4, NextItemTraining(loss="full_softmax"))
    generator = torch.Generator().manual_seed(0)
    first, second = recipe.batches(next(iter(data.training_epoch(generator))), generator)[:2]

    def adam(model: SASRec) -> Optimization:
        return build_optimization(
            model, lr=1e-2, weight_decay=0.0, schedule="constant", warmup_steps=0, total_steps=0, fused=False
        )

    train_one_epoch(accumulated, DataParallelLoss(accumulated, recipe, Workers(), False), [first, second],
                    adam(accumulated), False, generator, accumulate=2)  # fmt: skip
    by_hand = adam(reference)
    for batch in (first, second):
        (recipe.loss(reference, batch, generator)[0] / 2).backward()
    by_hand.step()

    for (name, got), want in zip(accumulated.state_dict().items(), reference.state_dict().values(), strict=True):
        torch.testing.assert_close(got, want, msg=name)
