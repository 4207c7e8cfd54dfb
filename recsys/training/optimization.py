"""The optimizers and learning-rate schedules of one training run.

Dense parameters go to Adam. An embedding table whose gradient is row-sparse (`nn.Embedding(sparse=True)`, e.g. an
item table under `sparse_item_gradients`) goes to SparseAdam, which updates only the rows a step read: dense Adam
would touch every row of a 10^6-item table on every step. Both follow one schedule (linear warm-up, then constant
or cosine decay). With a `max_grad_norm`, the dense parameters' gradients are scaled to that total L2 norm at most
before each step (the item tables updated elsewhere: row-sparse, sharded or updated in the backward pass, are not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.tensor import DTensor

from recsys.errors import ConfigError
from recsys.training.model_parallel import fused_table_parameters


@dataclass
class Optimization:
    optimizers: list[torch.optim.Optimizer]
    schedulers: list[torch.optim.lr_scheduler.LRScheduler]
    max_grad_norm: float | None = None  # None: gradients as they are
    clipped: list[nn.Parameter] = field(default_factory=list)  # the parameters whose gradients it bounds

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        """One optimizer step and one schedule step (the gradients clipped first, with a `max_grad_norm`)."""
        if self.max_grad_norm is not None:
            # on the device, no host sync (no error_if_nonfinite): a NaN norm shows as the epoch's NaN loss
            nn.utils.clip_grad_norm_(self.clipped, self.max_grad_norm, foreach=True)
        for optimizer in self.optimizers:
            optimizer.step()
        for scheduler in self.schedulers:
            scheduler.step()

    def state_dict(self, model: nn.Module) -> dict[str, Any]:
        """The optimizers' state keyed by `model`'s parameter names (torch.distributed.checkpoint's form, which
        loads on any number of processes, a sharded parameter's state with it) and the schedules' state.

        An optimizer that has not stepped yet gets its state made by a step that changes nothing, so the dict can
        be the template a saved state is loaded into."""
        for optimizer in self.optimizers:
            if isinstance(optimizer, torch.optim.SparseAdam) and not optimizer.state:
                _make_sparse_adam_state(optimizer)  # torch's own zero step gives it dense gradients, which it refuses
        return {
            "optimizers": get_optimizer_state_dict(model, self.optimizers),
            "schedulers": [s.state_dict() for s in self.schedulers],
        }

    def load_state_dict(self, model: nn.Module, state: dict[str, Any]) -> None:
        """Load what `state_dict` gave (filled from a checkpoint)."""
        set_optimizer_state_dict(model, self.optimizers, state["optimizers"])
        for scheduler, saved in zip(self.schedulers, state["schedulers"], strict=True):
            scheduler.load_state_dict(saved)


def _make_sparse_adam_state(optimizer: torch.optim.SparseAdam) -> None:
    """SparseAdam's state (zero moments), made by a step on empty sparse gradients: no row moves."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            no_rows = torch.empty(1, 0, dtype=torch.long, device=param.device)
            param.grad = torch.sparse_coo_tensor(no_rows, param.new_empty(0, *param.shape[1:]), param.shape)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def build_optimization(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    schedule: str,
    warmup_steps: int,
    total_steps: int,
    fused: bool,
    max_grad_norm: float | None = None,
) -> Optimization:
    """Adam over the dense parameters, SparseAdam over tables with row-sparse gradients, one schedule for both; with
    `max_grad_norm`, the dense parameters' gradients clipped to it."""
    sparse = [m.weight for m in model.modules() if isinstance(m, nn.Embedding) and m.sparse]
    in_backward = fused_table_parameters(model)  # tables torchrec's DMP updates inside the backward pass
    dense = [p for p in model.parameters() if all(p is not s for s in sparse + in_backward)]
    if sparse and weight_decay:
        raise ConfigError(
            "train.optimization.weight_decay with sparse_item_gradients: SparseAdam has no weight decay (it would "
            "have to touch every row). Fix: set train.optimization.weight_decay to 0, or "
            "model.training.sparse_item_gradients to false"
        )
    # a table sharded over the processes (DTensor) gets an Adam of its own: one optimizer's fused kernels take tensors
    # of one kind
    sharded = [p for p in dense if isinstance(p, DTensor)]
    dense = [p for p in dense if not isinstance(p, DTensor)]
    optimizers: list[torch.optim.Optimizer] = [
        torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, fused=fused) for params in (dense, sharded) if params
    ]
    if sparse:
        optimizers.append(torch.optim.SparseAdam(sparse, lr=lr))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    schedulers: list[torch.optim.lr_scheduler.LRScheduler] = [
        torch.optim.lr_scheduler.LambdaLR(o, factor) for o in optimizers
    ]
    return Optimization(optimizers, schedulers, max_grad_norm, clipped=dense)
