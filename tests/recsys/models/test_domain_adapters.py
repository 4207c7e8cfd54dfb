"""Domain data and the LoRA domain-adapted retriever: a domain's users and items, routing by history, training
only the adapters, and ranking within the domain."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from recsys.data.prepared import load_prepared
from recsys.evaluation import EvalConfig, evaluate
from recsys.models.domain_adapters import DomainAdaptedRetriever, DomainAdapterConfig
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.modules.lora import lora_layers
from recsys.training.trainer import fit
from tests.conftest import quick_train

EVAL = EvalConfig(ks=(10,))


def test_a_domains_data_keeps_its_items_and_ranks_only_them(tiny_data_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)
    assert data.domains == ["beauty", "home", "sports"]
    beauty = data.for_domain("beauty")
    item_domain = data.item_domains()
    assert beauty.candidates is not None and torch.equal(beauty.candidates, item_domain == 0)
    assert (item_domain[beauty.sequences.values] == 0).all() and int(beauty.sequences.lengths().min()) >= 3
    assert bool(beauty.training_excluded()[~beauty.candidates][1:].all())
    split = beauty.eval_split("test")
    assert split.user_idx.tolist() == beauty.users["user_idx"].to_list()  # the users keep their ids
    scores = torch.randn(data.num_items + 1)

    class Random:
        max_history = 20

        def score(self, histories: torch.Tensor, users: object = None, times: object = None) -> torch.Tensor:
            return scores.expand(histories.shape[0], -1).clone()

    result = evaluate(Random(), split, data.num_items, EvalConfig(ks=(10,)))
    ranked_first = scores.masked_fill(~beauty.candidates, float("-inf"))[1:].argmax() + 1
    assert item_domain[ranked_first] == 0 and result.metrics["coverage@10"] <= beauty.candidates.float().mean()
    with pytest.raises(KeyError, match="unknown domain 'toys'"):
        data.for_domain("toys")


def _adapted(data_dir: Path) -> tuple[DomainAdaptedRetriever, torch.Tensor]:
    data = load_prepared(data_dir)
    torch.manual_seed(0)
    base = SASRec(SASRecConfig(num_items=data.num_items, max_history=20, dim=16, num_heads=1, ffn_dim=32))
    config = DomainAdapterConfig(domains=tuple(data.domains), rank=2)
    return DomainAdaptedRetriever(config, base, data.item_domains()), data.item_domains()


def test_new_adapters_leave_the_base_unchanged_and_rows_route_by_their_last_item(tiny_data_dir: Path) -> None:
    model, item_domain = _adapted(tiny_data_dir)
    model.eval()
    beauty_items = torch.nonzero(item_domain == 0).squeeze(1)[:3]
    sports_items = torch.nonzero(item_domain == 2).squeeze(1)[:3]
    histories = torch.stack([beauty_items, sports_items, torch.zeros(3, dtype=torch.long)])
    assert model.history_domains(histories).tolist() == [0, 2, -1]
    before = model.score(histories)
    other_domain = (item_domain[None, :] != torch.tensor([0, 2, -1])[:, None]) & torch.tensor([[True], [True], [False]])
    # B = 0: adapters add nothing yet; each row ranks its domain's items only (the empty row: every item)
    torch.testing.assert_close(before, model.base.score(histories).masked_fill(other_domain, float("-inf")))
    with torch.no_grad():
        for layer in lora_layers(model):
            layer.adapter("sports").B.normal_()
    after = model.score(histories)
    torch.testing.assert_close(after[0], before[0])  # the beauty row does not read the sports adapter
    assert not torch.allclose(after[1], before[1])
    assert not torch.allclose(model.score_in(histories[:1], torch.tensor([2])), after[:1])  # the request's domain


def test_training_one_domain_moves_only_its_adapter(tiny_data_dir: Path) -> None:
    model, _ = _adapted(tiny_data_dir)
    base = {k: v.clone() for k, v in model.state_dict().items() if ".adapters." not in k}
    beauty = load_prepared(tiny_data_dir).for_domain("beauty")
    fit(
        model,
        beauty,
        quick_train(2, 4, 3e-3),
        EVAL,
    )
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in base.items())  # the base is frozen
    assert any(layer.adapter("beauty").B.abs().sum() > 0 for layer in lora_layers(model))
    assert all(layer.adapter("sports").B.abs().sum() == 0 for layer in lora_layers(model))
    # rank 2 on qkv (16 -> 48), out (16 -> 16), ffn (16 -> 32 -> 16) of 2 blocks
    assert model.adapter_parameters("beauty") == 2 * 2 * ((16 + 48) + (16 + 16) + (16 + 32) + (32 + 16))


def test_item_adapters_train_only_their_domains_rows(tiny_data_dir: Path) -> None:
    data = load_prepared(tiny_data_dir)
    torch.manual_seed(0)
    base = SASRec(SASRecConfig(num_items=data.num_items, max_history=20, dim=16, num_heads=1, ffn_dim=32))
    config = DomainAdapterConfig(domains=tuple(data.domains), rank=2, embedding_rank=2)
    model = DomainAdaptedRetriever(config, base, data.item_domains())
    table = model.base.item_embeddings().detach().clone()
    torch.testing.assert_close(model.item_embeddings(), table)  # a new item adapter changes nothing
    fit(
        model,
        data.for_domain("beauty"),
        quick_train(2, 4, 3e-3),
        EVAL,
    )
    beauty = data.item_domains() == 0
    moved = (model.item_embeddings().detach() - table).abs().sum(dim=1) > 0
    assert bool(moved[beauty].all()) and not bool(moved[~beauty].any())  # only beauty's items moved
    assert torch.equal(model.base.item_embeddings(), table)  # through the adapter, not the frozen table
    # each domain's adapter counts its items' rows: rank 2 x its items + B (2 x 16) on top of the block layers
    blocks = 2 * 2 * ((16 + 48) + (16 + 16) + (16 + 32) + (32 + 16))
    assert model.adapter_parameters("sports") == blocks + 2 * int((data.item_domains() == 2).sum()) + 2 * 16
    histories = torch.nonzero(beauty).squeeze(1)[:3][None, :]
    base_scores = model.base.score(histories).masked_fill(~beauty, float("-inf"))
    assert not torch.allclose(model.eval().score(histories), base_scores)
