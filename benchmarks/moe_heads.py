"""MoE vs dense ranking heads, and multi-task vs single-task, on the synthetic data's labels; writes JSON.

Usage:
    .venv/bin/python benchmarks/moe_heads.py [--users 3000] [--epochs 8]

Task: for every interaction of the synthetic data (`features.synthetic`), predict from the user (id + mean of the
previous 20 items) and the item whether it was a purchase (binary, AUC) and its rating (1..5, RMSE). The labels
depend on a latent user-item affinity, so both tasks are learnable and related. Per user, the last interaction
is the test example, the one before the validation example, the rest train.

Shared trunk: [user, item, user * item] -> Linear -> SiLU (dim D). Heads, compared at equal active parameters:
    dense:  one MLP D -> 3h -> D shared by the tasks, then a linear output per task;
    moe:    `recsys.modules.moe.MoELayer`, 8 experts of hidden h, top-2 + 1 shared expert (3 experts of hidden h
            per example = the dense head's active size), one router per task; balancing "bias" (DeepSeek-V3
            auxiliary-loss-free), "aux_loss" or "none".
Single-task baselines: the dense model trained on one task only. Step time: median training step (ms).
Expert load: share of routed slots per expert on the test examples, max / mean (1.0 = even).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS_DIR, command, machine, significant, versions, write_result
from features.synthetic import PURCHASE, SyntheticConfig, generate_synthetic
from recsys.modules.moe import MoEConfig, MoELayer

HISTORY = 20
TASKS = ("purchase", "rating")


@dataclass
class Examples:
    users: torch.Tensor  # (N,) user index
    histories: torch.Tensor  # (N, HISTORY) left-padded item index + 1 (0 = none)
    items: torch.Tensor  # (N,) item index + 1
    purchase: torch.Tensor  # (N,) 0/1
    rating: torch.Tensor  # (N,) 1..5

    def take(self, index: torch.Tensor) -> Examples:
        return Examples(*(t[index] for t in (self.users, self.histories, self.items, self.purchase, self.rating)))


def synthetic_examples(num_users: int, seed: int) -> tuple[Examples, Examples, Examples, int, int]:
    """(train, valid, test, number of users, number of items) from the synthetic generator."""
    frame = generate_synthetic(SyntheticConfig(num_users=num_users, seed=seed)).interactions.sort(["user_id", "ts"])
    frame = frame.with_columns(
        pl.col("user_id").rank("dense").cast(pl.Int64).alias("u") - 1,
        pl.col("item_id").rank("dense").cast(pl.Int64).alias("i"),  # 1-based: 0 pads histories
    )
    users, items = frame["u"].to_numpy().copy(), frame["i"].to_numpy().copy()
    histories = np.zeros((len(frame), HISTORY), dtype=np.int64)
    starts = np.r_[0, np.flatnonzero(np.diff(users)) + 1]
    ends = np.r_[starts[1:], len(frame)]
    for start, end in zip(starts, ends, strict=True):
        for row in range(start, end):
            previous = items[max(start, row - HISTORY) : row]
            if len(previous):
                histories[row, -len(previous) :] = previous
    from_end = np.concatenate([np.arange(end - start)[::-1] for start, end in zip(starts, ends, strict=True)])
    data = Examples(
        torch.from_numpy(users),
        torch.from_numpy(histories),
        torch.from_numpy(items),
        torch.from_numpy((frame["event"] == PURCHASE).to_numpy().astype(np.float32)),
        torch.from_numpy(frame["value"].to_numpy().astype(np.float32)),
    )
    split = torch.from_numpy(from_end)
    return (
        data.take(torch.nonzero(split >= 2).squeeze(1)),
        data.take(torch.nonzero(split == 1).squeeze(1)),
        data.take(torch.nonzero(split == 0).squeeze(1)),
        int(users.max()) + 1,
        int(items.max()),
    )


class MultiTaskRanker(nn.Module):
    """User + item features -> shared trunk -> dense or MoE head -> one output per task."""

    def __init__(
        self,
        num_users: int,
        num_items: int,
        tasks: tuple[str, ...],
        head: str,
        dim: int,
        hidden: int,
        balancing: str = "bias",
    ) -> None:
        super().__init__()
        self.tasks = tasks
        self.user_emb = nn.Embedding(num_users, dim)
        self.item_emb = nn.Embedding(num_items + 1, dim, padding_idx=0)
        self.trunk = nn.Sequential(nn.Linear(3 * dim, dim), nn.SiLU())
        self.moe = (
            MoELayer(
                MoEConfig(
                    dim=dim,
                    hidden=hidden,
                    num_experts=8,
                    top_k=2,
                    num_tasks=len(tasks),
                    balancing=balancing,
                    bias_update_rate=1e-2,
                )
            )
            if head == "moe"
            else None
        )
        # equal active size: top-2 + the shared expert = 3 experts of `hidden`
        dense = nn.Sequential(nn.Linear(dim, 3 * hidden), nn.SiLU(), nn.Linear(3 * hidden, dim))
        self.dense = dense if head == "dense" else None
        self.outputs = nn.ModuleList(nn.Linear(dim, 1) for _ in tasks)

    def forward(self, batch: Examples) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        history = self.item_emb(batch.histories)  # (B, H, D)
        count = (batch.histories > 0).sum(dim=1, keepdim=True).clamp_min(1)
        user = self.user_emb(batch.users) + history.sum(dim=1) / count
        item = self.item_emb(batch.items)
        x = self.trunk(torch.cat([user, item, user * item], dim=1))
        if self.moe is not None:
            out = self.moe(x)
            hidden, aux = [x + h for h in out.outputs], out.aux_loss
        else:
            assert self.dense is not None
            shared = x + self.dense(x)
            hidden, aux = [shared] * len(self.tasks), x.new_zeros(())
        return {t: head(h).squeeze(1) for t, head, h in zip(self.tasks, self.outputs, hidden, strict=True)}, aux


def task_loss(task: str, prediction: torch.Tensor, batch: Examples) -> torch.Tensor:
    if task == "purchase":
        return F.binary_cross_entropy_with_logits(prediction, batch.purchase)
    return F.mse_loss(prediction, batch.rating)


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties)."""
    ranks = torch.from_numpy(_average_ranks(scores.numpy())).double()
    positives = labels.bool()
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    order = values.argsort(kind="mergesort")
    ranks = np.empty(len(values))
    sorted_values = values[order]
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


@torch.no_grad()
def metrics(model: MultiTaskRanker, data: Examples) -> dict[str, float]:
    model.eval()
    if model.moe is not None:
        model.moe.reset_load()
    predictions, _ = model(data)
    out = {}
    if "purchase" in predictions:
        out["purchase_auc"] = auc(predictions["purchase"], data.purchase)
    if "rating" in predictions:
        out["rating_rmse"] = float(F.mse_loss(predictions["rating"].clamp(1, 5), data.rating).sqrt())
    if model.moe is not None:
        out["load_max_over_mean"] = float(model.moe.load()["max_over_mean"])
    return out


def train(
    model: MultiTaskRanker, train_data: Examples, valid: Examples, epochs: int, batch_size: int, seed: int
) -> dict[str, Any]:
    """Adam, keeping the epoch with the best validation score (AUC, else -RMSE); returns its metrics and timing."""
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    best: tuple[float, dict[str, Any], dict[str, torch.Tensor]] | None = None
    steps: list[float] = []
    for _ in range(epochs):
        model.train()
        for index in torch.randperm(len(train_data.items), generator=generator).split(batch_size):
            batch = train_data.take(index)
            start = time.perf_counter()
            predictions, aux = model(batch)
            loss = sum(task_loss(t, p, batch) for t, p in predictions.items()) + 0.01 * aux
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[union-attr]
            optimizer.step()
            steps.append(time.perf_counter() - start)
        scores = metrics(model, valid)
        key = scores.get("purchase_auc", -scores.get("rating_rmse", 0.0))
        if best is None or key > best[0]:
            best = (key, scores, {k: v.clone() for k, v in model.state_dict().items()})
    assert best is not None
    model.load_state_dict(best[2])
    return {"step_ms": significant(statistics.median(steps) * 1e3, 3)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    train_data, valid, test, num_users, num_items = synthetic_examples(args.users, args.seed)
    variants = [
        ("dense multi-task", ("purchase", "rating"), "dense", "none"),
        ("moe multi-task, bias balancing", ("purchase", "rating"), "moe", "bias"),
        ("moe multi-task, aux-loss balancing", ("purchase", "rating"), "moe", "aux_loss"),
        ("moe multi-task, no balancing", ("purchase", "rating"), "moe", "none"),
        ("dense single-task purchase", ("purchase",), "dense", "none"),
        ("dense single-task rating", ("rating",), "dense", "none"),
    ]
    rows = []
    for name, tasks, head, balancing in variants:
        torch.manual_seed(args.seed)
        model = MultiTaskRanker(num_users, num_items, tasks, head, args.dim, args.hidden, balancing)
        timing = train(model, train_data, valid, args.epochs, args.batch_size, args.seed)
        active = _active_head_parameters(model)
        rows.append(
            {
                "model": name,
                "tasks": list(tasks),
                "head": head,
                "balancing": balancing,
                "head_active_parameters": active,
                **timing,
                "test": {k: significant(v) for k, v in metrics(model, test).items()},
            }
        )
        print(f"{name}: {rows[-1]['test']} step {timing['step_ms']} ms, active head parameters {active}")
    return {
        "data": {
            "source": "synthetic",
            "users": num_users,
            "items": num_items,
            "train": len(train_data.items),
            "valid": len(valid.items),
            "test": len(test.items),
        },
        "config": {
            "dim": args.dim,
            "expert_hidden": args.hidden,
            "experts": 8,
            "top_k": 2,
            "shared_expert": True,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "seed": args.seed,
        },
        "models": rows,
    }


def _active_head_parameters(model: MultiTaskRanker) -> int:
    """Parameters one example uses in the head: dense MLP, or top-k + shared experts (routers included)."""
    if model.dense is not None:
        return sum(p.numel() for p in model.dense.parameters())
    assert model.moe is not None
    expert = sum(p.numel() for p in model.moe.experts[0].parameters())
    routers = sum(p.numel() for p in model.moe.routers.parameters())
    return (model.moe.config.top_k + int(model.moe.config.shared_expert)) * expert + routers


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=3000)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--name", default="moe-heads-synthetic")
    args = parser.parse_args(argv)
    result = {
        "name": args.name,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        **run(args),
        "device": "cpu",
        "machine": machine(),
        "versions": versions(),
        "command": command(),
    }
    path = write_result(args.name, result, args.results_dir)
    print(f"-> {path}")
    return path


if __name__ == "__main__":
    main()
