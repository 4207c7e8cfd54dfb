"""No validation or test target reaches the two-tower's training.

Two datasets go through the real pipeline (prepare, content embeddings, semantic IDs, train): a small synthetic one,
and the same with every user's two held-out interactions (the validation and test targets) replaced by training
interactions drawn at random. The recipe's loss is wrapped to record what it receives at every step: the batch, the
sparse features the towers read (history, recent, hashed user id, item id with the random negatives, semantic-ID
prefixes), the content and prefix buffers, the logQ table and every parameter before the step. Had a held-out target
reached training, through the examples, the features, the user buckets' updates, the negatives or the popularity
counts, some of it would differ between the two runs: it must all be equal, and the examples must be exactly the
pairs of the training part.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch

from features.prepare import prepare
from features.raw import RawDataset
from features.sources import load_source
from pipelines.config import load_config
from pipelines.runner import run_pipeline
from recsys.data.batching import HistoryBatch
from recsys.data.prepared import load_prepared
from recsys.data.schema import ITEM_ID, TS, USER_ID
from recsys.data.splits import TEST, VALID, held_out
from recsys.models.two_tower import TwoTower
from recsys.training.recipes import TwoTowerRecipe

MAX_HISTORY, EPOCHS = 20, 2
SYNTHETIC = {"num_users": 120, "num_items": 80}  # more users than user buckets: some share one
# every feature on: history, recent, hashed user id (fewer buckets than users), semantic-ID prefixes, content
# the pooled user tower: its feature bags name every input the loss receives (the sequence tower reads the same pairs)
PARAMS = {"max_history": MAX_HISTORY, "user_tower": "pooled", "recent": 3, "dim": 16, "hidden_dim": 32,
          "user_buckets": 64, "sid_levels": 2}  # fmt: skip
MODEL = {"name": "two_tower", "params": {**PARAMS, "use_content": True}, "training": {"num_negatives": 32}}
SID = {"method": "rqkmeans", "rqkmeans": {"levels": 2, "codebook_size": 8}}
# every epoch trains whatever validation says: the two runs must take the same steps
TRAIN = {"schedule": {"epochs": EPOCHS, "patience": EPOCHS + 1}, "optimization": {"batch_size": 64}}


@dataclass(frozen=True)
class LossCall:
    """What one training step's loss received (copies, taken before the step updates anything)."""

    batch: HistoryBatch
    features: tuple[tuple[tuple[str, ...], torch.Tensor, torch.Tensor], ...]  # (keys, lengths, values) per tower call
    content: torch.Tensor  # (V+1, C) the item tower's content embeddings
    prefix_rows: torch.Tensor  # (V+1, L) its semantic-ID prefix rows
    target_log_probs: torch.Tensor  # (V+1,) the logQ table
    parameters: torch.Tensor  # every parameter, flattened
    loss: torch.Tensor

    def tensors(self) -> dict[str, torch.Tensor]:
        named = {"histories": self.batch.histories, "targets": self.batch.targets, "users": self.batch.users}
        for call, (keys, lengths, values) in enumerate(self.features):
            named |= {f"{'/'.join(keys)} #{call} lengths": lengths, f"{'/'.join(keys)} #{call} values": values}
        return named | {"content": self.content, "prefix_rows": self.prefix_rows, "logQ": self.target_log_probs,
                        "parameters": self.parameters, "loss": self.loss}  # fmt: skip


def record_loss_calls(monkeypatch: pytest.MonkeyPatch) -> list[LossCall]:
    """Wrap `TwoTowerRecipe.loss` (the real one still computes every loss) to record what each call receives."""
    calls: list[LossCall] = []
    real_loss = TwoTowerRecipe.loss

    def recording(self: TwoTowerRecipe, model: TwoTower, batch: HistoryBatch, generator: torch.Generator) -> Any:
        features: list[tuple[tuple[str, ...], torch.Tensor, torch.Tensor]] = []

        def keep(_module: torch.nn.Module, args: tuple[Any, ...]) -> None:
            kjt = args[0]
            features.append((tuple(kjt.keys()), kjt.lengths().clone(), kjt.values().clone()))

        parameters = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
        towers = [
            t for t in (model.user_features, model.item_features) if t is not None
        ]  # the sequence tower: no user bags
        hooks = [tower.register_forward_pre_hook(keep) for tower in towers]
        try:
            loss, targets = real_loss(self, model, batch, generator)
        finally:
            for hook in hooks:
                hook.remove()
        calls.append(LossCall(batch, tuple(features), model.content.clone(), model.prefix_rows.clone(),
                              self.target_log_probs.clone(), parameters, loss.detach().clone()))  # fmt: skip
        return loss, targets

    monkeypatch.setattr(TwoTowerRecipe, "loss", recording)
    return calls


def with_held_out_replaced(raw: RawDataset) -> RawDataset:
    """`raw` with each user's two held-out interactions (the last two by ts, ties in file order, as `prepare` orders
    them) given the item, domain, event and value of training interactions drawn at random, keeping users and times:
    the same training interactions, other validation and test targets with other counts. A held-out item that no
    training interaction names stays, so the same items remain (and get the same ids)."""
    rows = raw.interactions.sort(USER_ID, TS, maintain_order=True)
    back = pl.len().over(USER_ID) - 1 - pl.int_range(pl.len()).over(USER_ID)  # 0 = the user's last interaction
    is_held_out = back < held_out(VALID)
    training, held = rows.filter(~is_held_out), rows.filter(is_held_out)
    drawn = training.sample(held.height, with_replacement=True, seed=0).drop(USER_ID, TS)
    replaced = held.select(USER_ID, TS).hstack(drawn).select(rows.columns)
    only_held_out = ~held[ITEM_ID].is_in(training[ITEM_ID].implode())
    swapped = pl.concat([replaced.filter(~only_held_out), held.filter(only_held_out)])
    # a stable sort keeps a held-out interaction after a training one of the same time, as in `raw`
    return RawDataset(pl.concat([training, swapped]).sort(USER_ID, TS, maintain_order=True), raw.items, raw.source)


@dataclass(frozen=True)
class Run:
    data_dir: Path
    calls: list[LossCall]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> dict[str, Run]:
    """The pipeline trained on the small synthetic data ("factual") and on it with other held-out items."""
    raw = load_source("synthetic", None, seed=0, **SYNTHETIC)
    work = tmp_path_factory.mktemp("leakage")  # one work dir: the second run reads the first's content embeddings
    runs = {}
    for name, dataset in (("factual", raw), ("counterfactual", with_held_out_replaced(raw))):
        data_dir = work / "data" / name
        prepare(dataset, data_dir)
        (work / name).mkdir()
        config = load_config(tiny_config(work / name, name=name, model=MODEL, sid=SID, train=TRAIN,
                                         tracking={"enabled": False}))  # fmt: skip
        with pytest.MonkeyPatch.context() as monkeypatch:
            calls = record_loss_calls(monkeypatch)
            outputs, _ = run_pipeline(config, work, until="train_retriever", data_dir=data_dir)
        assert outputs.content is not None and outputs.semantic_ids is not None  # the features were built
        runs[name] = Run(data_dir, calls)
    return runs


def test_the_counterfactual_data_differs_in_the_held_out_targets_alone(runs: dict[str, Run]) -> None:
    factual, counterfactual = (load_prepared(runs[name].data_dir) for name in ("factual", "counterfactual"))
    assert factual.items.equals(counterfactual.items)
    assert torch.equal(factual.training_sequences().values, counterfactual.training_sequences().values)
    assert torch.equal(factual.training_sequences().offsets, counterfactual.training_sequences().offsets)
    for split in (VALID, TEST):
        ours, theirs = factual.eval_split(split).targets, counterfactual.eval_split(split).targets
        assert (ours != theirs).float().mean() > 0.8, f"{split}: most targets stayed"
        counts = (torch.bincount(targets, minlength=factual.num_items + 1) for targets in (ours, theirs))
        assert not torch.equal(*counts), f"{split}: the targets' counts stayed"


def test_training_examples_are_exactly_the_pairs_of_the_training_part(runs: dict[str, Run]) -> None:
    data = load_prepared(runs["factual"].data_dir)
    expected: Counter[tuple[int, tuple[int, ...], int]] = Counter()
    for row in range(data.num_users):
        items = data.sequences.row(row).tolist()[: -held_out(VALID)]  # without the validation and test targets
        for k in range(1, len(items)):
            expected[(row + 1, tuple(items[max(0, k - MAX_HISTORY) : k]), items[k])] += EPOCHS
    received: Counter[tuple[int, tuple[int, ...], int]] = Counter()
    for call in runs["factual"].calls:
        for user, history, target in zip(call.batch.users, call.batch.histories, call.batch.targets, strict=True):
            received[(int(user), tuple(history[history != 0].tolist()), int(target))] += 1
    assert received == expected


def test_nothing_the_loss_receives_depends_on_the_held_out_targets(runs: dict[str, Run]) -> None:
    factual, counterfactual = runs["factual"].calls, runs["counterfactual"].calls
    assert len(factual) == len(counterfactual) > 0
    assert {len(call.features) for call in factual} == {2}  # the user tower's call and the item tower's
    assert factual[0].features[0][0] == ("history", "recent", "user")
    assert factual[0].features[1][0] == ("item_id", "sid_prefix")
    for step, (ours, theirs) in enumerate(zip(factual, counterfactual, strict=True)):
        other = theirs.tensors()
        for name, tensor in ours.tensors().items():
            assert torch.equal(tensor, other[name]), f"step {step}: {name} depends on the held-out targets"
