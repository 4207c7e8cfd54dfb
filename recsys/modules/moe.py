"""Mixture-of-experts heads: E expert MLPs, top-k routing per example, optional shared expert, one gate per task.

Capacity grows with E while each example pays for k experts (plus the shared one). Each task has its own
router over the same experts (MMoE-style), so one layer serves several task heads. Two ways to keep the
experts evenly used (`balancing`):

- "aux_loss": the Switch/GShard load loss E * sum_e f_e * P_e (f_e = share of routed slots that chose
  expert e, P_e = mean routing probability of e), returned for the trainer to add to its loss;
- "bias": DeepSeek-V3's auxiliary-loss-free balancing: a per-expert bias is added to the scores only to
  choose the top-k (the mixing weights stay the unbiased scores); after each training batch the bias of an
  over-used expert goes down by `bias_update_rate` and that of an under-used one up.

Dimension letters: B examples, D input dim, H expert hidden dim, O output dim, E experts, K top-k, T tasks.

Example:
    >>> layer = MoELayer(MoEConfig(dim=8, hidden=16, num_experts=4, top_k=2, num_tasks=2))
    >>> out = layer(torch.randn(5, 8))
    >>> [tuple(o.shape) for o in out.outputs], out.aux_loss.shape
    ([(5, 8), (5, 8)], torch.Size([]))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class MoEConfig:
    dim: int
    hidden: int
    out_dim: int | None = None  # None = dim
    num_experts: int = 8
    top_k: int = 2
    shared_expert: bool = True  # one expert every example always uses, beside its routed ones
    num_tasks: int = 1
    gate: Literal["sigmoid", "softmax"] = "sigmoid"  # DeepSeek-V3 scores experts with sigmoids
    balancing: Literal["bias", "aux_loss", "none"] = "bias"
    bias_update_rate: float = 1e-3  # "bias": step of the per-expert bias after each training batch
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"top_k must be in 1..num_experts ({self.num_experts}), got {self.top_k}")
        if self.num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {self.num_tasks}")


@dataclass
class MoEOutput:
    outputs: list[torch.Tensor]  # T x (B, O), one per task
    aux_loss: torch.Tensor  # scalar; zero unless balancing == "aux_loss"


class _Expert(nn.Module):
    def __init__(self, dim: int, hidden: int, out_dim: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.SiLU(), nn.Dropout(dropout), nn.Linear(hidden, out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MoELayer(nn.Module):
    balance_bias: torch.Tensor  # (T, E) buffers, declared for type checkers
    routed: torch.Tensor

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.config = config
        self.out_dim = out_dim = config.out_dim or config.dim
        self.experts = nn.ModuleList(
            _Expert(config.dim, config.hidden, out_dim, config.dropout) for _ in range(config.num_experts)
        )
        self.shared = _Expert(config.dim, config.hidden, out_dim, config.dropout) if config.shared_expert else None
        self.routers = nn.ModuleList(
            nn.Linear(config.dim, config.num_experts, bias=False) for _ in range(config.num_tasks)
        )
        self.register_buffer("balance_bias", torch.zeros(config.num_tasks, config.num_experts))
        # routed examples per (task, expert) since the last `reset_load()`: what `load()` reports
        self.register_buffer("routed", torch.zeros(config.num_tasks, config.num_experts), persistent=False)

    def forward(self, x: torch.Tensor, tasks: Sequence[int] | None = None) -> MoEOutput:
        """x (B, D) -> one (B, O) output per task (of `tasks` only, in that order, when given: the experts run for
        those tasks' choices alone), and the auxiliary load loss."""
        tasks = range(len(self.routers)) if tasks is None else tasks
        weights, chosen, aux = self._route(x, tasks)  # (T, B, K) mixing weights, (T, B, K) expert ids
        outputs = [x.new_zeros(x.shape[0], self.out_dim) for _ in tasks]
        for e, expert in enumerate(self.experts):
            hits = chosen == e  # (T, B, K)
            rows = hits.any(dim=(0, 2)).nonzero().squeeze(1)  # examples any task sent to e: one expert call
            if rows.numel() == 0:
                continue
            y = expert(x[rows])  # (n, O)
            for t, out in enumerate(outputs):
                w = (weights[t] * hits[t]).sum(dim=1)[rows]  # (n,) e's weight for task t (0 if not chosen)
                out.index_add_(0, rows, (y * w[:, None].to(y.dtype)).to(out.dtype))  # bf16 experts under autocast
        if self.shared is not None:
            shared = self.shared(x)
            outputs = [out + shared for out in outputs]
        return MoEOutput(outputs=outputs, aux_loss=aux)

    def active_parameters(self) -> int:
        """Parameters one example uses: its top-k experts, the shared expert and the routers."""
        expert = sum(p.numel() for p in self.experts[0].parameters())
        routers = sum(p.numel() for p in self.routers.parameters())
        return (self.config.top_k + int(self.shared is not None)) * expert + routers

    def load(self) -> dict[str, list[float] | float]:
        """Share of routed slots per expert since the last reset (over tasks), and max/mean of it."""
        stats = expert_load(self, reset=False)
        assert stats is not None  # self is an MoE layer
        return stats

    def reset_load(self) -> None:
        self.routed.zero_()

    def _route(self, x: torch.Tensor, tasks: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cfg = self.config
        index = torch.tensor(list(tasks), device=x.device)
        logits = torch.stack([self.routers[t](x) for t in tasks]).float()  # (T, B, E)
        scores = torch.sigmoid(logits) if cfg.gate == "sigmoid" else logits.softmax(dim=-1)
        selection = scores + self.balance_bias[index, None, :] if cfg.balancing == "bias" else scores
        chosen = selection.topk(cfg.top_k, dim=-1).indices  # (T, B, K)
        weights = scores.gather(-1, chosen)
        weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-9)  # (T, B, K), sums to 1
        counts = F.one_hot(chosen, cfg.num_experts).sum(dim=2).sum(dim=1).float()  # (T, E) slots per expert
        self.routed.index_add_(0, index, counts.detach())
        if self.training and cfg.balancing == "bias":
            with torch.no_grad():  # over-used experts get chosen less next batch, under-used more
                step = cfg.bias_update_rate * torch.sign(counts - counts.mean(-1, keepdim=True))
                self.balance_bias.index_add_(0, index, -step)
        aux = x.new_zeros(())
        if cfg.balancing == "aux_loss":
            share = counts / counts.sum(dim=-1, keepdim=True)  # (T, E) f_e
            prob = (scores / scores.sum(dim=-1, keepdim=True)).mean(dim=1)  # (T, E) P_e
            aux = cfg.num_experts * (share * prob).sum(dim=-1).mean()
        return weights.to(x.dtype), chosen, aux


def expert_load(model: nn.Module, reset: bool = True) -> dict[str, list[float] | float] | None:
    """Expert load of `model`'s MoE layers since their last reset (slots summed over layers); None without any.

    Returns {"fraction": share of routed slots per expert, "max_over_mean": busiest expert / even share}.
    """
    layers = [m for m in model.modules() if isinstance(m, MoELayer)]
    if not layers:
        return None
    counts = torch.stack([layer.routed.sum(dim=0) for layer in layers]).sum(dim=0)  # (E,)
    if reset:
        for layer in layers:
            layer.reset_load()
    total = float(counts.sum())
    if not total:
        return {"fraction": [0.0] * counts.numel(), "max_over_mean": 0.0}
    fractions = (counts / total).tolist()
    return {"fraction": fractions, "max_over_mean": max(fractions) * counts.numel()}
