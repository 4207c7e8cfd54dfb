"""The query-aware retriever: its three uses (history, query, both), its recipe (queries drawn from the bank, hidden
histories), and its pipeline (training queries made and embedded with the content, the model saved and reloaded)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines.config import load_config
from recsys.data.batching import PackedBatch, packed_next_item_batches
from recsys.data.jagged import Jagged
from recsys.models.family import ModelInputs
from recsys.models.query_aware import QueryAwareConfig, QueryAwareRetriever
from recsys.models.registry import build_model, load_model, save_model
from recsys.training.losses import full_softmax_loss
from recsys.training.recipes import NextItemRecipe, QueryBank, QueryRecipe

ITEMS, CONTENT_DIM = 12, 6
COLOURS = ("red", "blue", "green", "black")
KINDS = ("lipstick", "mascara", "serum")
TITLES = [f"{colour} {kind} item{k}" for k, (colour, kind) in enumerate((c, k) for c in COLOURS for k in KINDS)]


def model(seed: int = 0, lexical: bool = True) -> QueryAwareRetriever:
    torch.manual_seed(seed)
    config = QueryAwareConfig(ITEMS, max_history=6, dim=8, num_heads=1, ffn_dim=16, dropout=0.0, attn_dropout=0.0,
                              content_dim=CONTENT_DIM, lexical=lexical)  # fmt: skip
    content = torch.randn(ITEMS + 1, CONTENT_DIM)
    content[0] = 0
    return QueryAwareRetriever(config, content, TITLES)


def bank() -> QueryBank:
    """Items 1..ITEMS with 0, 1 or 2 queries each (item k: k % 3 of them, words of its title)."""
    counts = torch.tensor([0, *(k % 3 for k in range(1, ITEMS + 1))])
    texts = tuple(TITLES[k - 1].split()[n] for k in range(1, ITEMS + 1) for n in range(k % 3))
    offsets = torch.cat([torch.zeros(1).long(), counts.cumsum(0)])
    return QueryBank(torch.randn(int(counts.sum()), CONTENT_DIM), offsets, texts)


def batch() -> PackedBatch:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 3, 6, 4])
    values = torch.randint(1, ITEMS + 1, (int(lengths.sum()),), generator=gen)
    sequences = Jagged(values, torch.cat([torch.zeros(1).long(), lengths.cumsum(0)]))
    return next(iter(packed_next_item_batches(sequences, 6, 4, gen)))


def test_a_history_a_query_or_both_score_every_item() -> None:
    m = model().eval()
    histories = torch.tensor([[0, 0, 3, 4], [0, 0, 0, 0]])  # the second user has no history
    queries, texts = torch.randn(2, CONTENT_DIM), ["red lipstick", "serum"]
    with torch.no_grad():
        alone = m.score(histories)
        both = m.score_with_queries(histories, queries, texts)
        search = m.score_with_queries(torch.zeros(2, 0, dtype=torch.long), queries, texts)
        no_history_vector = m.without_history(1)
    assert alone.shape == both.shape == search.shape == (2, ITEMS + 1)
    torch.testing.assert_close(alone[1], (m.without_query(no_history_vector) @ m.item_embeddings().T)[0])  # h_0
    torch.testing.assert_close(search[1], both[1])  # an all-padding history is no history
    assert not torch.allclose(alone[0], both[0])  # the query moves the scores


def test_fuse_leaves_the_rows_without_a_query_alone() -> None:
    m = model()
    states, queries = torch.randn(3, 8), torch.randn(3, CONTENT_DIM)
    fused, lexical = m.fuse(states, queries, torch.tensor([True, False, True]))
    assert fused.shape == (3, 8 + CONTENT_DIM) and lexical.shape == (3, 1)
    torch.testing.assert_close(fused[1], m.without_query(states)[1])  # its text tower empty
    assert float(lexical[1].detach()) == 0.0 and float(lexical[0].detach()) > 0.0  # and its lexical tower
    assert not torch.allclose(fused[0], m.without_query(states)[0])


def test_the_text_tower_ranks_the_title_a_query_repeats_first() -> None:
    """With the learned tower's query path off and the text tower's weight large, search is the cosine of the query
    and the titles in the encoder's space: a query embedded like an item's title finds that item."""
    m = model().eval()
    with torch.no_grad():
        m.gate.bias.fill_(-30.0)  # g = 0: P(q) adds nothing to the learned tower
        m.text_gate.bias.fill_(30.0)  # t = 1
        m.text_scale.fill_(1e3)
        search = m.score_with_queries(torch.zeros(ITEMS, 0, dtype=torch.long), m.content[1:] * 3.0, ["x"] * ITEMS)
    assert search[:, 1:].argmax(dim=1).tolist() == list(range(ITEMS))  # column j + 1 = item j + 1


def test_the_lexical_tower_ranks_the_titles_holding_the_query_words_first() -> None:
    """With the other towers' query paths off and the lexical weight large, search is BM25: "blue serum" finds the
    one title with both words first, then the titles with one of them."""
    m = model().eval()
    with torch.no_grad():
        m.gate.bias.fill_(-30.0)
        m.text_gate.bias.fill_(-30.0)  # t = 0: no cosine
        assert m.lexical_gate is not None and m.lexical_scale is not None
        m.lexical_gate.bias.fill_(30.0)
        m.lexical_scale.fill_(1e3)
        scores = m.score_with_queries(torch.zeros(1, 0, dtype=torch.long), torch.randn(1, CONTENT_DIM), ["blue serum"])
    ranked = scores[0, 1:].argsort(descending=True).tolist()
    titles = [TITLES[i] for i in ranked]
    assert titles[0].startswith("blue serum")
    assert all("blue" in t or "serum" in t for t in titles[:6]) and not any("blue" in t for t in titles[6:])


def test_the_lexical_tower_is_saved_with_the_model_and_needs_the_query_texts(tmp_path: Path) -> None:
    m = model().eval()
    save_model(tmp_path / "model.pt", m)
    _, loaded = load_model(tmp_path / "model.pt")  # built without texts: the state dict brings them
    assert isinstance(loaded, QueryAwareRetriever) and loaded.lexical is not None
    assert loaded.lexical.texts == TITLES
    history, query = torch.tensor([[0, 1, 2]]), torch.randn(1, CONTENT_DIM)
    with torch.no_grad():
        torch.testing.assert_close(loaded.score_with_queries(history, query, ["mascara"]),
                                   m.score_with_queries(history, query, ["mascara"]))  # fmt: skip
        with pytest.raises(ValueError, match="query's text"):
            m.score_with_queries(history, query)
        model(lexical=False).eval().score_with_queries(history, query)  # without the tower: no texts needed


def test_item_vectors_are_kept_between_inference_calls_until_the_weights_change() -> None:
    m = model().eval()
    with torch.no_grad():
        first = m.item_embeddings()
        assert m.item_embeddings() is first  # a request reuses them
    loss = m.score_with_queries(torch.tensor([[0, 1, 2]]), torch.randn(1, CONTENT_DIM), ["red"]).sum()
    loss.backward()
    torch.optim.SGD(m.parameters(), lr=0.1).step()
    with torch.no_grad():
        after = m.item_embeddings()
        m.load_state_dict(model(seed=1).state_dict())
        loaded = m.item_embeddings()
    assert after is not first and not torch.allclose(after, first)  # the step changed them, and the cache saw it
    torch.testing.assert_close(loaded, model(seed=1).eval().item_embeddings().detach())  # so did the load


def test_the_bank_draws_each_items_own_queries() -> None:
    b = bank()
    items = torch.tensor([1, 2, 3, 5, 5, 5, 5])
    drawn = b.draw(items, torch.Generator().manual_seed(0))
    assert drawn.has_any.tolist() == [True, True, False, True, True, True, True]
    for item, vector, text, present in zip(items.tolist(), drawn.vectors, drawn.texts, drawn.has_any.tolist(),
                                           strict=True):  # fmt: skip
        own = range(b.offsets[item], b.offsets[item + 1])
        assert not present or any(torch.equal(vector, b.vectors[row]) and text == b.texts[row] for row in own)
        assert present or text == ""


def test_without_queries_the_loss_is_the_learned_towers_next_item_loss() -> None:
    m, packed = model(), batch()
    real = packed.targets != 0
    states, targets = m(packed.inputs, packed.segments, packed.positions)[real], packed.targets[real]
    plain = full_softmax_loss(states, m.input_embeddings(), targets)  # a SASRec over id + P(content)
    recipe = QueryRecipe(NextItemRecipe(max_history=6, rows_per_batch=4), bank(), 0.0, 0.0)
    with_recipe, n = recipe.loss(m, packed, torch.Generator().manual_seed(0))
    assert n == targets.numel() and torch.allclose(plain, with_recipe)


def test_a_hidden_history_trains_h0_and_the_query_path_not_the_transformer() -> None:
    m, packed = model(), batch()
    counts = torch.tensor([0, *([1] * ITEMS)])  # every item has a query: every target is queried, history hidden
    offsets = torch.cat([torch.zeros(1).long(), counts.cumsum(0)])
    everything = QueryBank(torch.randn(ITEMS, CONTENT_DIM), offsets, tuple(t.split()[0] for t in TITLES))
    recipe = QueryRecipe(NextItemRecipe(max_history=6, rows_per_batch=4), everything, 1.0, 1.0)
    loss, _ = recipe.loss(m, packed, torch.Generator().manual_seed(0))
    loss.backward()
    assert m.no_history.grad is not None and m.no_history.grad.abs().sum() > 0
    assert m.gate.weight.grad is not None and m.text.weight.grad is not None
    assert m.text_gate.weight.grad is not None and m.text_scale.grad is not None
    assert m.lexical_gate is not None and m.lexical_gate.weight.grad is not None
    assert m.lexical_scale is not None and m.lexical_scale.grad is not None and float(m.lexical_scale.grad) != 0.0
    block = next(iter(m.sasrec.blocks.parameters()))
    assert block.grad is None or not block.grad.any()


def test_the_registry_builds_saves_and_reloads_it(tmp_path: Path) -> None:
    content = torch.randn(ITEMS + 1, CONTENT_DIM)
    params = {"max_history": 6, "dim": 8, "num_heads": 1, "ffn_dim": 16}
    inputs = ModelInputs(content=content, content_encoder="my-encoder", item_texts=tuple(TITLES))
    built = build_model("query_aware", params, ITEMS, inputs)
    assert isinstance(built, QueryAwareRetriever) and built.config.encoder == "my-encoder"
    save_model(tmp_path / "model.pt", built)
    name, loaded = load_model(tmp_path / "model.pt")
    assert name == "query_aware" and loaded.config == built.config
    torch.testing.assert_close(loaded.content, built.content)
    with pytest.raises(Exception, match="content encoder"):
        build_model("query_aware", params, ITEMS, ModelInputs(content=content))
    with pytest.raises(Exception, match="indexes the items' texts"):
        build_model("query_aware", params, ITEMS, ModelInputs(content=content, content_encoder="my-encoder"))
    without = build_model("query_aware", {**params, "lexical": False}, ITEMS,
                          ModelInputs(content=content, content_encoder="my-encoder"))  # fmt: skip
    assert isinstance(without, QueryAwareRetriever) and without.lexical is None


def test_the_pipeline_makes_embeds_and_trains_on_training_queries(
    tmp_path: Path, tiny_config: Callable[..., Path]
) -> None:
    from pipelines.runner import run_pipeline  # imports the kernels: after TRITON_INTERPRET is set

    config = load_config(tiny_config(
        tmp_path, name="tiny-query-aware",
        model={"name": "query_aware", "params": {"max_history": 20, "dim": 32, "num_heads": 1, "ffn_dim": 64},
               "training": {"queries_per_item": 3}},
        content={"text_fields": ["title"]}, train={"schedule": {"epochs": 2}}, tracking={"enabled": False},
    ))  # fmt: skip
    outputs, _ = run_pipeline(config, tmp_path / "work", until="train_retriever")
    assert outputs.content is not None and outputs.content.queries is not None and outputs.model is not None
    saved = np.load(outputs.content.queries)
    offsets = saved["offsets"]
    assert offsets[0] == offsets[1] == 0 and offsets[-1] == len(saved["texts"]) == len(saved["vectors"])
    assert 0 < len(saved["texts"]) <= 3 * (len(offsets) - 2)
    name, trained = load_model(outputs.model.model_dir / "model.pt")
    assert name == "query_aware" and isinstance(trained, QueryAwareRetriever)
    assert trained.config.encoder == config.content.model
    assert trained.lexical is not None and len(trained.lexical.texts) == trained.config.num_items
    assert outputs.model.metrics["test"]["ndcg@10"] > 0
