"""LoRA domain adapters: a mixed-domain batch equals each domain alone, merge/unmerge give identical outputs,
only adapters train, adapters save and load apart from the base."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from recsys.modules.lora import (
    DomainItemLoRA,
    LoRAConfig,
    LoRALinear,
    add_lora,
    load_adapter,
    lora_layers,
    route,
    save_adapter,
)

DOMAINS = ("beauty", "sports", "toys")


def model_with_adapters(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))
    add_lora(model, ["0", "2"], LoRAConfig(domains=DOMAINS, rank=4, alpha=8.0))
    for layer in lora_layers(model):  # trained adapters: B is no longer zero
        for adapter in layer.adapters.values():
            nn.init.normal_(adapter.B, std=0.1)
    return model.eval()


def test_a_new_adapter_leaves_the_base_outputs_unchanged() -> None:
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(5, 16)
    expected = base(x)
    add_lora(base, ["0", "2"], LoRAConfig(domains=DOMAINS))
    with route(base, torch.tensor([0, 1, 2, 0, 1])):
        torch.testing.assert_close(base(x), expected)


def test_a_mixed_batch_equals_each_domain_alone() -> None:
    model = model_with_adapters()
    x = torch.randn(7, 16)
    domains = torch.tensor([2, 0, -1, 1, 1, 0, 2])
    with route(model, domains):
        mixed = model(x)
    for d in (-1, 0, 1, 2):
        rows = domains == d
        with route(model, torch.full((int(rows.sum()),), d)):
            torch.testing.assert_close(mixed[rows], model(x[rows]), rtol=1e-5, atol=1e-6)
    with route(model, torch.full((7,), -1)):
        base_only = model(x)
    assert not torch.allclose(mixed[0], base_only[0])  # adapters change the outputs of their domain


@pytest.mark.parametrize("domain", DOMAINS)
def test_merge_and_unmerge_give_identical_outputs(domain: str) -> None:
    model = model_with_adapters()
    x = torch.randn(6, 16)
    index = DOMAINS.index(domain)
    with route(model, torch.full((6,), index)):
        routed = model(x)
    weights = [layer.base_layer.weight.clone() for layer in lora_layers(model)]
    for layer in lora_layers(model):
        layer.merge(domain)
    merged = model(x)  # no routing needed: the adapter is in the base weight
    torch.testing.assert_close(merged, routed, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="unmerge"):
        lora_layers(model)[0].merge(domain)
    for layer, weight in zip(lora_layers(model), weights, strict=True):
        layer.unmerge()
        torch.testing.assert_close(layer.base_layer.weight, weight, rtol=0, atol=1e-6)


def test_only_adapters_train_and_they_are_small() -> None:
    model = model_with_adapters()
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".adapters." in name for name in trainable)
    adapter_params = sum(p.numel() for n, p in model.named_parameters() if ".adapters.beauty." in n)
    assert adapter_params == 4 * (16 + 32) + 4 * (32 + 32)  # rank x (in + out) per wrapped layer
    with route(model, torch.tensor([0, 0])):
        model(torch.randn(2, 16)).sum().backward()
    layer = lora_layers(model)[0]
    assert layer.base_layer.weight.grad is None
    assert layer.adapters["beauty"].A.grad is not None and layer.adapters["sports"].A.grad is None


def test_adapters_save_and_load_apart_from_the_base(tmp_path: Path) -> None:
    trained, fresh = model_with_adapters(seed=0), model_with_adapters(seed=0)
    for layer in lora_layers(fresh):
        nn.init.zeros_(layer.adapters["sports"].B)
    save_adapter(trained, "sports", tmp_path / "sports.pt")
    load_adapter(fresh, "sports", tmp_path / "sports.pt")
    x = torch.randn(4, 16)
    with route(trained, torch.ones(4, dtype=torch.long)), route(fresh, torch.ones(4, dtype=torch.long)):
        torch.testing.assert_close(fresh(x), trained(x))
    other = nn.Sequential(nn.Linear(16, 4))
    add_lora(other, ["0"], LoRAConfig(domains=DOMAINS))
    with pytest.raises(ValueError, match="does not fit"):
        load_adapter(other, "sports", tmp_path / "sports.pt")


def test_wrapping_refuses_what_it_cannot_adapt() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with pytest.raises(TypeError, match=r"not an nn\.Linear"):
        add_lora(model, ["1"], LoRAConfig(domains=("a",)))
    with pytest.raises(ValueError, match="distinct"):
        LoRAConfig(domains=("a", "a"))
    add_lora(model, ["0"], LoRAConfig(domains=("a",)))
    assert isinstance(model[0], LoRALinear)
    with route(model, torch.zeros(3, dtype=torch.long)), pytest.raises(ValueError, match="batch of 2"):
        model(torch.randn(2, 4))


def test_item_adapters_change_only_their_domains_rows_and_save_apart(tmp_path: Path) -> None:
    item_domain = torch.tensor([-1, 0, 1, 0, 1, 1])  # the padding, then items of beauty (0) and sports (1)
    items = DomainItemLoRA(item_domain, dim=4, domains=DOMAINS, rank=2, alpha=4.0)
    assert torch.equal(items.delta(), torch.zeros(6, 4))  # A = 0: a new adapter changes nothing
    assert items.adapter_parameters("sports") == 3 * 2 + 2 * 4  # its 3 items' rows of A, and B
    with torch.no_grad():
        items.A.normal_()
        items.B["beauty"].zero_()
    delta = items.delta()
    assert delta is not None and torch.equal(delta[[0, 1, 3]], torch.zeros(3, 4))  # padding, beauty (B = 0)
    torch.testing.assert_close(delta[[2, 4, 5]], 2.0 * items.A[[2, 4, 5]] @ items.B["sports"])
    model = nn.Module()
    model.items = items
    save_adapter(model, "sports", tmp_path / "sports.pt")
    fresh = nn.Module()
    fresh.items = DomainItemLoRA(item_domain, dim=4, domains=DOMAINS, rank=2, alpha=4.0)
    load_adapter(fresh, "sports", tmp_path / "sports.pt")
    torch.testing.assert_close(fresh.items.delta(), delta)
    moved = nn.Module()
    moved.items = DomainItemLoRA(torch.tensor([-1, 1, 0, 0, 1, 1]), dim=4, domains=DOMAINS, rank=2, alpha=4.0)
    with pytest.raises(ValueError, match="other items"):
        load_adapter(moved, "sports", tmp_path / "sports.pt")
    assert DomainItemLoRA(item_domain, dim=4, domains=DOMAINS, rank=0, alpha=4.0).delta() is None
