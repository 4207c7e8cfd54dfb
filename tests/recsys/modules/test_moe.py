"""MoE heads: top-k routing equals a per-example reference, the shared expert is always on, and both
balancing schemes even out a skewed router."""

from __future__ import annotations

import pytest
import torch

from recsys.modules.moe import MoEConfig, MoELayer


def reference(layer: MoELayer, x: torch.Tensor, task: int) -> torch.Tensor:
    """Each example alone: its k best-scored experts (bias only for the choice), weights renormalised."""
    cfg = layer.config
    out = []
    for row in x:
        logits = layer.routers[task](row).float()
        scores = torch.sigmoid(logits) if cfg.gate == "sigmoid" else logits.softmax(-1)
        pick = scores + layer.balance_bias[task] if cfg.balancing == "bias" else scores
        chosen = pick.topk(cfg.top_k).indices
        w = scores[chosen] / scores[chosen].sum()
        y = sum(w[i] * layer.experts[int(e)](row) for i, e in enumerate(chosen))
        out.append(y + (layer.shared(row) if layer.shared is not None else 0))
    return torch.stack(out)


@pytest.mark.parametrize("gate", ["sigmoid", "softmax"])
@pytest.mark.parametrize("shared", [True, False])
def test_outputs_match_the_per_example_reference_for_every_task(gate: str, shared: bool) -> None:
    torch.manual_seed(0)
    cfg = MoEConfig(dim=6, hidden=12, out_dim=5, num_experts=5, top_k=2, shared_expert=shared, num_tasks=3, gate=gate)
    layer = MoELayer(cfg).eval()
    layer.balance_bias.copy_(torch.randn_like(layer.balance_bias) * 0.1)  # the bias must steer the choice only
    x = torch.randn(9, 6)
    out = layer(x)
    for task in range(3):
        torch.testing.assert_close(out.outputs[task], reference(layer, x, task), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out.outputs[0], out.outputs[1])  # each task has its own gate


def test_a_call_for_some_tasks_runs_and_balances_their_gates_only() -> None:
    torch.manual_seed(0)
    layer = MoELayer(MoEConfig(dim=6, hidden=12, num_experts=4, top_k=2, num_tasks=3, bias_update_rate=0.1))
    x = torch.randn(8, 6)
    full = layer.eval()(x)
    layer.reset_load()
    part = layer.train()(x, tasks=range(1, 3))  # the ranker's category tasks: gates 1 and 2
    assert len(part.outputs) == 2
    for mine, theirs in zip(part.outputs, full.outputs[1:], strict=True):
        torch.testing.assert_close(mine, theirs)
    assert layer.routed[0].sum() == 0 and layer.routed[1:].sum() == 2 * 8 * 2  # 2 tasks x 8 rows x top-2
    assert torch.equal(layer.balance_bias[0], torch.zeros(4)) and layer.balance_bias[1:].abs().sum() > 0


def test_gradients_reach_the_chosen_experts_and_the_routers_only() -> None:
    torch.manual_seed(0)
    layer = MoELayer(MoEConfig(dim=4, hidden=8, num_experts=6, top_k=1, shared_expert=False))
    x = torch.randn(3, 4)
    layer(x).outputs[0].sum().backward()
    used = {int(e) for e in torch.sigmoid(layer.routers[0](x)).argmax(-1)}
    for e, expert in enumerate(layer.experts):
        has_grad = expert.net[0].weight.grad is not None and bool(expert.net[0].weight.grad.abs().sum() > 0)
        assert has_grad == (e in used)
    assert layer.routers[0].weight.grad is not None  # the mixing weights carry the router's gradient


def skewed_run(balancing: str, steps: int = 300) -> float:
    """max/mean expert load over the last 50 steps of a router trained on inputs that all favour expert 0."""
    torch.manual_seed(0)
    cfg = MoEConfig(dim=8, hidden=8, num_experts=8, top_k=2, balancing=balancing, bias_update_rate=0.01)  # type: ignore[arg-type]
    layer = MoELayer(cfg)
    with torch.no_grad():
        layer.routers[0].weight.zero_()
        layer.routers[0].weight[0] = 1.0  # expert 0 scores highest for positive inputs
        layer.routers[0].weight[1] = 0.5
    optimizer = torch.optim.Adam(layer.parameters(), lr=1e-2)
    target = torch.randn(8)
    for step in range(steps):
        if step == steps - 50:
            layer.reset_load()
        x = torch.rand(64, 8) + 0.5
        out = layer(x)
        loss = (out.outputs[0] - target).pow(2).mean() + 0.1 * out.aux_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    load = layer.load()
    assert abs(sum(load["fraction"]) - 1.0) < 1e-6  # type: ignore[arg-type]
    return float(load["max_over_mean"])  # type: ignore[arg-type]


def test_balancing_evens_out_a_skewed_router() -> None:
    unbalanced = skewed_run("none")
    assert unbalanced > 3.0  # experts 0 and 1 take almost every slot: max/mean near 4
    assert skewed_run("bias") <= 1.2  # the bar
    assert skewed_run("aux_loss") <= 1.2


def test_a_top_k_larger_than_the_experts_is_refused() -> None:
    with pytest.raises(ValueError, match="top_k"):
        MoEConfig(dim=4, hidden=4, num_experts=2, top_k=3)


def test_expert_load_sums_the_moe_layers_of_a_model_and_resets_them() -> None:
    from recsys.modules.moe import expert_load

    model = torch.nn.Sequential(
        MoELayer(MoEConfig(dim=4, hidden=8, num_experts=4, top_k=1, balancing="none")),
    )
    assert expert_load(torch.nn.Linear(2, 2)) is None  # no MoE layer
    layer = model[0]
    layer.routed.copy_(torch.tensor([[3.0, 1.0, 0.0, 0.0]]))
    load = expert_load(model)
    assert load == {"fraction": [0.75, 0.25, 0.0, 0.0], "max_over_mean": 3.0}
    assert float(layer.routed.sum()) == 0.0  # reset for the next epoch
