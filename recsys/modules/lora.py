"""LoRA domain adapters (MLoRA-style): one base model for every domain, a small low-rank adapter per domain.

`LoRALinear` wraps a frozen `nn.Linear` (kept as `base_layer`, never edited) and holds one adapter per
domain in a `ModuleDict` keyed by domain name: y = base(x) + (alpha / r) * B_d(A_d(x)). B starts at zero,
so a new adapter leaves the base model's outputs unchanged until it is trained. A batch may mix domains:
`route(model, domains)` tells every wrapped layer which adapter each example uses (-1 = the base alone).
For one domain at a time, `merge(domain)` folds its adapter into the base weight (no extra matmul at
serving time) and `unmerge()` takes it out again. `DomainItemLoRA` is the same idea for an item table whose items
belong to domains: a low-rank delta per domain over its own items' rows. `save_adapter` / `load_adapter` move one
domain's weights of both kinds.

Dimension letters: B examples, I in features, O out features, R rank.

Example:
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> add_lora(model, ["0", "2"], LoRAConfig(domains=("beauty", "sports"), rank=2))
    ['0', '2']
    >>> with route(model, torch.tensor([0, 1, -1])):
    ...     model(torch.randn(3, 4)).shape
    torch.Size([3, 2])
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from recsys.runtime.atomic import atomic_file


@dataclass(frozen=True)
class LoRAConfig:
    domains: tuple[str, ...]  # adapter names; a batch routes examples by their index in this tuple
    rank: int = 8
    alpha: float = 16.0  # the adapter's output is scaled by alpha / rank
    dropout: float = 0.0  # on the adapter's input only

    def __post_init__(self) -> None:
        if not self.domains or len(set(self.domains)) != len(self.domains):
            raise ValueError(f"LoRAConfig.domains must be distinct names, got {self.domains!r}")
        if self.rank < 1:
            raise ValueError(f"LoRAConfig.rank must be >= 1, got {self.rank}")


class _Adapter(nn.Module):
    def __init__(self, in_features: int, out_features: int, rank: int) -> None:
        super().__init__()
        self.A = nn.Parameter(torch.empty(rank, in_features))  # (R, I)
        self.B = nn.Parameter(torch.zeros(out_features, rank))  # (O, R): zero, so a new adapter changes nothing
        nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))

    def delta_weight(self) -> torch.Tensor:
        return self.B @ self.A  # (O, I)


class LoRALinear(nn.Module):
    def __init__(self, base_layer: nn.Linear, config: LoRAConfig) -> None:
        super().__init__()
        self.base_layer = base_layer.requires_grad_(False)
        self.config = config
        self.scale = config.alpha / config.rank
        self.adapters = nn.ModuleDict(
            {name: _Adapter(base_layer.in_features, base_layer.out_features, config.rank) for name in config.domains}
        )
        self.dropout = nn.Dropout(config.dropout)
        self.domains: torch.Tensor | None = None  # (B,) adapter index per example, set by `route`
        self.merged: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, ..., I) -> (B, ..., O); example b uses the adapter `domains[b]` (-1: none)."""
        y = self.base_layer(x)
        if self.domains is None or self.merged is not None:
            return y
        if self.domains.shape[0] != x.shape[0]:
            raise ValueError(f"route() gave {self.domains.shape[0]} domains for a batch of {x.shape[0]} examples")
        h = self.dropout(x)
        for index, name in enumerate(self.config.domains):
            adapter = self.adapter(name)
            rows = (self.domains == index).nonzero().squeeze(1)
            if rows.numel():  # (n, ..., I) -> (n, ..., R) -> (n, ..., O)
                delta = (h[rows] @ adapter.A.T) @ adapter.B.T
                y = y.index_add(0, rows, self.scale * delta.to(y.dtype))
        return y

    def adapter(self, domain: str) -> _Adapter:
        adapter = self.adapters[domain]
        assert isinstance(adapter, _Adapter)
        return adapter

    def merge(self, domain: str) -> None:
        """Fold `domain`'s adapter into the base weight (serving one domain without the extra matmuls)."""
        if self.merged is not None:
            raise RuntimeError(f"adapter {self.merged!r} is merged already: unmerge() first")
        with torch.no_grad():
            self.base_layer.weight += self.scale * self.adapter(domain).delta_weight().to(self.base_layer.weight.dtype)
        self.merged = domain

    def unmerge(self) -> None:
        if self.merged is None:
            return
        with torch.no_grad():
            delta = self.adapter(self.merged).delta_weight().to(self.base_layer.weight.dtype)
            self.base_layer.weight -= self.scale * delta
        self.merged = None


class DomainItemLoRA(nn.Module):
    """Per-domain low-rank deltas of an item table whose items each belong to one domain (LoRA on an embedding,
    as peft's `lora.Embedding`, one adapter per domain): item i's row gains (alpha / r) * A[i] @ B_d, d = i's
    domain. The rows of A are owned by their items' domains, so domain d's adapter is its items' rows of A plus
    B_d; items of no domain (-1: the padding) get no delta. Items, not examples, pick the adapter, so one
    adapted table serves a mixed-domain batch. It also holds the item -> domain map (`item_domain`).

    A starts at zero (a new adapter changes nothing), B at random (so A gets gradients). Rank 0: no adapter,
    the map alone. Training one domain leaves the other domains' rows and B untouched only while their items
    get no gradient (softmax within the domain) and no weight decay: the pipeline's adapter training
    (`pipelines.train`) refuses the settings that break either.
    """

    def __init__(self, item_domain: torch.Tensor, dim: int, domains: Sequence[str], rank: int, alpha: float) -> None:
        super().__init__()
        if rank < 0:
            raise ValueError(f"DomainItemLoRA rank must be >= 0 (0 = no item adapter), got {rank}")
        self.domains = tuple(domains)
        self.rank = rank
        self.scale = alpha / rank if rank else 0.0
        self.item_domain: torch.Tensor
        self.register_buffer("item_domain", item_domain.long().clone(), persistent=True)  # (V+1,), -1 = none
        self.A = nn.Parameter(torch.zeros(item_domain.numel(), rank))  # (V+1, R)
        self.B = nn.ParameterDict({name: nn.Parameter(torch.randn(rank, dim) / max(rank, 1)) for name in domains})

    def delta(self) -> torch.Tensor | None:
        """(V+1, D) every item's domain delta, None at rank 0."""
        if not self.rank:
            return None
        rows = [(self.item_domain == index)[:, None] * self.A for index in range(len(self.domains))]  # (V+1, R)
        return self.scale * torch.stack([r @ self.B[name] for r, name in zip(rows, self.domains, strict=True)]).sum(0)

    def domain_rows(self, domain: str) -> torch.Tensor:
        """The item ids whose rows of A belong to `domain`."""
        return (self.item_domain == self.domains.index(domain)).nonzero().squeeze(1)

    def adapter_parameters(self, domain: str) -> int:
        return self.domain_rows(domain).numel() * self.rank + self.B[domain].numel()


def add_lora(model: nn.Module, targets: Sequence[str], config: LoRAConfig) -> list[str]:
    """Wrap the `nn.Linear` submodules named in `targets` (dotted names, e.g. "blocks.0.ffn.0") in place;
    freeze everything else of `model`. Returns the wrapped names."""
    model.requires_grad_(False)
    for name in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = getattr(parent, child)
        if not isinstance(layer, nn.Linear):
            raise TypeError(f"{name} is a {type(layer).__name__}, not an nn.Linear: LoRA wraps linear layers")
        setattr(parent, child, LoRALinear(layer, config))
    return list(targets)


def lora_layers(model: nn.Module) -> list[LoRALinear]:
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


@contextmanager
def route(model: nn.Module, domains: torch.Tensor) -> Iterator[None]:
    """Within the block, example b of a forward pass uses adapter `domains[b]` in every LoRA layer."""
    layers = lora_layers(model)
    for layer in layers:
        layer.domains = domains
    try:
        yield
    finally:
        for layer in layers:
            layer.domains = None


def adapter_state(model: nn.Module, domain: str) -> dict[str, torch.Tensor]:
    """One domain's adapter weights, keyed by layer name: A and B of every LoRA linear layer, and of a
    `DomainItemLoRA` its B and the domain's rows of A (with their item ids, so a load checks they match)."""
    state = {}
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            state.update({f"{name}.{key}": t.detach().cpu() for key, t in module.adapters[domain].state_dict().items()})
        elif isinstance(module, DomainItemLoRA) and module.rank:
            rows = module.domain_rows(domain)
            state[f"{name}.items"] = rows.cpu()
            state[f"{name}.A"] = module.A.detach()[rows].cpu()
            state[f"{name}.B"] = module.B[domain].detach().cpu()
    return state


def save_adapter(model: nn.Module, domain: str, path: Path) -> None:
    """Write one domain's adapter alone (atomically): adapters ship and hot-swap apart from the base."""
    with atomic_file(path) as tmp:
        torch.save(adapter_state(model, domain), tmp)


def load_adapter(model: nn.Module, domain: str, path: Path) -> None:
    """Load an adapter written by `save_adapter` into `domain`'s slot; the layer names must match."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    expected = set(adapter_state(model, domain))
    if set(state) != expected:
        raise ValueError(
            f"{path} does not fit this model's LoRA layers (missing {sorted(expected - set(state))[:3]}, "
            f"unexpected {sorted(set(state) - expected)[:3]}). Fix: load it into the model it was trained with"
        )
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            adapter = module.adapter(domain)
            with torch.no_grad():
                adapter.A.copy_(state[f"{name}.A"])
                adapter.B.copy_(state[f"{name}.B"])
        elif isinstance(module, DomainItemLoRA) and module.rank:
            rows = module.domain_rows(domain)
            if not torch.equal(state[f"{name}.items"], rows.cpu()):
                raise ValueError(
                    f"{path} adapts other items of domain {domain!r} than this model holds. Fix: load it into a "
                    "model over the same data"
                )
            with torch.no_grad():
                module.A[rows] = state[f"{name}.A"].to(module.A.device)
                module.B[domain].copy_(state[f"{name}.B"])
