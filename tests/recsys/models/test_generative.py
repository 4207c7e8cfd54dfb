"""The generative retriever: trie-constrained beam search is exact when the beam covers the catalog."""

from __future__ import annotations

from typing import Any, Literal

import pytest
import torch
import torch.nn.functional as F

from recsys.data.batching import HistoryBatch
from recsys.data.jagged import Jagged
from recsys.data.prepared import TrainingRows
from recsys.models.generative import GenerativeConfig, GenerativeRetriever
from recsys.training.config import HardwareConfig, OptimizationConfig, ScheduleConfig, TrainConfig
from tests.conftest import popularity_valid_metric, unique_codes

SIZES = (4, 3, 2)


def catalog(num_items: int = 14, seed: int = 0) -> torch.Tensor:
    """(V+1, T) unique random codes, row 0 = padding."""
    return unique_codes(num_items, SIZES, seed)


def model(
    codes: torch.Tensor,
    beam: int,
    user_buckets: int = 5,
    new_item_slots: int = 0,
    dense_weight: float = 0.0,
    beam_precision: Literal["fp32", "bf16"] = "fp32",
    popularity_correction: float = 0.0,
    retrieval_candidates: int = 0,
    retrieval_weight: float = 1.0,
) -> GenerativeRetriever:
    torch.manual_seed(0)
    config = GenerativeConfig(
        num_items=codes.shape[0] - 1,
        codebook_sizes=SIZES,
        dim=16,
        num_heads=2,
        ffn_dim=32,
        num_encoder_layers=1,
        num_decoder_layers=1,
        beam_size=beam,
        user_buckets=user_buckets,
        new_item_slots=new_item_slots,
        dense_weight=dense_weight,
        beam_precision=beam_precision,
        popularity_correction=popularity_correction,
        retrieval_candidates=retrieval_candidates,
        retrieval_weight=retrieval_weight,
    )
    return GenerativeRetriever(config, codes).eval()


def exact_log_probs(m: GenerativeRetriever, histories: torch.Tensor, users: torch.Tensor) -> torch.Tensor:
    """(B, V+1) log-prob of every item's tuple under trie-masked, per-level renormalised decoding."""
    trie = m.trie()
    memory, pad = m.encode(histories, users)
    V = m.config.num_items
    out = torch.full((histories.shape[0], V + 1), float("-inf"))
    for item in range(1, V + 1):
        codes = m.codes[item]
        total = torch.zeros(histories.shape[0])
        key = torch.zeros(histories.shape[0], dtype=torch.long)
        for t in range(m.levels):
            states = m.decode(memory, pad, codes[:t].expand(histories.shape[0], t))[:, -1]
            logits = m.level_logits(states, t).masked_fill(~trie.allowed_next(t, key), float("-inf"))
            total += F.log_softmax(logits, -1)[:, codes[t]]
            key = key * SIZES[t] + codes[t]
        out[:, item] = total
    return out


def test_beam_search_with_a_full_beam_is_exact() -> None:
    codes = catalog()
    m = model(codes, beam=14)
    histories, users = torch.tensor([[0, 0, 3, 4], [0, 0, 0, 0], [1, 2, 3, 4]]), torch.tensor([3, 0, 9])
    items, scores = m.generate(histories, users)
    exact = exact_log_probs(m, histories, users)
    for b in range(len(histories)):
        assert sorted(items[b].tolist()) == list(range(1, 15)), "every item must come out exactly once"
        torch.testing.assert_close(scores[b], exact[b, items[b]], rtol=1e-4, atol=1e-4)
        assert (scores[b][:-1] >= scores[b][1:]).all()


def test_a_bf16_beam_runs_the_matmuls_in_bf16_and_sums_log_probs_in_fp32() -> None:
    codes = catalog()
    histories, users = torch.tensor([[0, 0, 3, 4], [0, 0, 0, 0], [1, 2, 3, 4]]), torch.tensor([3, 0, 9])
    fp32_items, fp32_scores = model(codes, beam=14).generate(histories, users)
    bf16 = model(codes, beam=14, beam_precision="bf16")  # the same weights (seeded)
    dtypes: set[torch.dtype] = set()
    for layer in bf16.modules():
        if isinstance(layer, torch.nn.Linear):
            layer.register_forward_hook(lambda module, inputs, output: dtypes.add(output.dtype))
    items, scores = bf16.generate(histories, users)
    assert dtypes == {torch.bfloat16} and scores.dtype == torch.float32
    for b in range(len(histories)):  # a full beam: every item, each scored about as in fp32
        assert sorted(items[b].tolist()) == sorted(fp32_items[b].tolist()) == list(range(1, 15))
        torch.testing.assert_close(scores[b], fp32_scores[b][fp32_items[b].argsort()][items[b] - 1], atol=0.1, rtol=0)
        assert (scores[b][:-1] >= scores[b][1:]).all()


def test_small_beam_returns_only_real_items_best_first() -> None:
    codes = catalog()
    m = model(codes, beam=3)
    histories, users = torch.tensor([[5, 6, 7], [0, 0, 1]]), torch.tensor([1, 2])
    items, scores = m.generate(histories, users)
    assert items.shape == (2, 3) and (items >= 1).all()
    exact = exact_log_probs(m, histories, users)
    for b in range(2):
        assert set(items[b].tolist()) <= set(range(1, 15))
        torch.testing.assert_close(scores[b], exact[b, items[b]], rtol=1e-4, atol=1e-4)


def test_score_matrix_has_only_the_beam_items() -> None:
    m = model(catalog(), beam=4)
    scores = m.score(torch.tensor([[1, 2]]))
    assert scores.shape == (1, 15)
    assert torch.isfinite(scores).sum() == 4 and scores[0, 0] == float("-inf")


def test_user_token_personalises_and_hashes_into_buckets() -> None:
    m = model(catalog(), beam=14, user_buckets=5)
    histories = torch.tensor([[1, 2, 3]]).expand(4, -1)
    scores = m.score(histories, torch.tensor([1, 2, 6, 0]))
    assert not torch.equal(scores[0], scores[1]), "different users, same history: the user token must matter"
    torch.testing.assert_close(scores[0], scores[2])  # user_idx 1 and 6 share bucket 1 of 5
    torch.testing.assert_close(scores[3], m.score(histories[:1])[0])  # user_idx 0 = no user given
    no_token = model(catalog(), beam=14, user_buckets=0)
    assert no_token.user_emb is None
    torch.testing.assert_close(no_token.score(histories[:2], torch.tensor([1, 2]))[0], no_token.score(histories[:1])[0])


def test_sequence_log_probs_are_the_exact_trie_constrained_log_probs() -> None:
    m = model(catalog(), beam=4)
    histories, users = torch.tensor([[0, 3, 4], [5, 6, 7]]), torch.tensor([1, 2])
    memory, pad = m.encode(histories, users)
    items = torch.tensor([[1, 14, 0], [7, 2, 9]])
    exact = exact_log_probs(m, histories, users)
    got = m.sequence_log_probs(memory, pad, items)
    torch.testing.assert_close(got[:, :2], exact.gather(1, items[:, :2]), rtol=1e-4, atol=1e-4)
    assert got[0, 2] == float("-inf")  # item 0 = no item
    torch.testing.assert_close(got[1], exact[1, items[1]], rtol=1e-4, atol=1e-4)


def test_new_items_get_their_reserved_slots_and_comparable_scores() -> None:
    new = torch.zeros(15, dtype=torch.bool)
    new[[2, 5, 11]] = True
    m = model(catalog(), beam=6, new_item_slots=2)
    histories, users = torch.tensor([[0, 3, 4], [1, 1, 2]]), torch.tensor([3, 4])
    exact = exact_log_probs(m, histories, users)
    assert torch.equal(m.generate(histories, users)[0], model(catalog(), beam=6).generate(histories, users)[0])

    m.mark_new_items(new)
    items, scores = m.generate(histories, users)
    for b in range(2):
        row = items[b].tolist()
        assert len(set(row)) == 6 and sum(new[i] for i in row) == 2, "4 old items and 2 new ones, each once"
        torch.testing.assert_close(scores[b], exact[b, items[b]], rtol=1e-4, atol=1e-4)
        assert (scores[b][:-1] >= scores[b][1:]).all(), "ranked by their log-prob over the whole catalog"
    # beams as wide as each part of the catalogue (11 old items, 3 new ones): the search is exhaustive, so the new
    # items' slots hold exactly the new items, whatever their scores under the whole catalog
    wide = model(catalog(), beam=14, new_item_slots=3)
    wide.mark_new_items(new)
    items, scores = wide.generate(histories, users)
    for b in range(2):
        assert sorted(items[b].tolist()) == list(range(1, 15))
        torch.testing.assert_close(scores[b], exact[b, items[b]], rtol=1e-4, atol=1e-4)


def test_training_logits_have_one_head_per_level() -> None:
    m = model(catalog(), beam=4).train()
    logits = m(torch.tensor([[1, 2, 3], [0, 4, 5]]), torch.tensor([6, 7]))
    assert [tuple(x.shape) for x in logits] == [(2, 4), (2, 3), (2, 2)]


def test_generative_training_beats_popularity_on_structured_ids(tiny_data_dir) -> None:  # type: ignore[no-untyped-def]
    """Codes = (category, brand, de-dup) of the synthetic catalog: a few epochs must beat popularity."""
    import polars as pl

    from recsys.data.prepared import load_prepared
    from recsys.evaluation import EvalConfig
    from recsys.training.trainer import fit

    data = load_prepared(tiny_data_dir)
    items = data.items.with_columns(
        pl.col("category").rank("dense").cast(pl.Int64).alias("c0") - 1,
        pl.col("brand").rank("dense").cast(pl.Int64).alias("c1") - 1,
    )
    items = items.with_columns(pl.int_range(pl.len()).over("c0", "c1").alias("c2"))
    codes = torch.tensor(items.select("c0", "c1", "c2").to_numpy(), dtype=torch.long)
    sizes = tuple(int(codes[:, t].max()) + 1 for t in range(3))
    codes = torch.cat([torch.zeros(1, 3, dtype=torch.long), codes])
    config = GenerativeConfig(
        num_items=data.num_items, codebook_sizes=sizes, dim=32, num_heads=2, ffn_dim=64,
        num_encoder_layers=1, num_decoder_layers=1, beam_size=10,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GenerativeRetriever(config, codes)
    eval_config = EvalConfig(ks=(10,))
    train = TrainConfig(
        schedule=ScheduleConfig(epochs=4),
        optimization=OptimizationConfig(batch_size=64, lr=3e-3),
        hardware=HardwareConfig(precision="fp32"),
        progress=False,
    )
    result = fit(model, data, train, eval_config)
    baseline = popularity_valid_metric(data, eval_config, "recall@10")
    assert result.best_valid["recall@10"] > 1.5 * baseline > 0


def test_label_smoothing_mixes_each_level_target_with_a_uniform_distribution() -> None:
    from recsys.data.batching import HistoryBatch
    from recsys.training.recipes import GenerativeRecipe

    codes = catalog()
    m = model(codes, beam=4)  # eval mode: no dropout, so both losses see the same logits
    batch = HistoryBatch(
        histories=torch.tensor([[0, 1, 2], [3, 4, 5]]), targets=torch.tensor([6, 7]), users=torch.tensor([1, 2])
    )
    eps = 0.2
    logits = m(batch.histories, batch.targets, batch.users)
    expected = []
    for t, lg in enumerate(logits):
        log_p = F.log_softmax(lg.float(), -1)
        target = codes[batch.targets][:, t]
        nll = -log_p.gather(1, target[:, None]).squeeze(1)
        expected.append(((1 - eps) * nll - eps * log_p.mean(-1)).mean())
    smoothed, _ = GenerativeRecipe(3, 2, label_smoothing=eps).loss(m, batch, torch.Generator())
    plain, _ = GenerativeRecipe(3, 2).loss(m, batch, torch.Generator())
    torch.testing.assert_close(smoothed, torch.stack(expected).mean())
    assert smoothed.item() != plain.item()


def test_a_batch_left_padded_to_a_wider_bucket_has_the_same_loss() -> None:
    """`length_buckets` pads batches on the left: the encoder masks the padding and counts history slots from the most
    recent item, so the loss (hence the training) is the narrow batch's."""
    from recsys.data.batching import HistoryBatch
    from recsys.training.recipes import GenerativeRecipe

    m = model(catalog(), beam=4)  # eval mode: no dropout
    narrow = HistoryBatch(torch.tensor([[1, 2], [0, 4]]), torch.tensor([6, 7]), torch.tensor([1, 2]))
    wide = HistoryBatch(torch.tensor([[0, 0, 1, 2], [0, 0, 0, 4]]), narrow.targets, narrow.users)
    recipe = GenerativeRecipe(max_history=4, batch_size=2)
    torch.testing.assert_close(recipe.loss(m, wide, torch.Generator())[0], recipe.loss(m, narrow, torch.Generator())[0])


def test_length_buckets_must_rise_and_need_batches_by_length() -> None:
    from recsys.training.recipes.pairs import GenerativeTraining

    assert GenerativeTraining(length_buckets=(4, 8, 12)).length_buckets == (4, 8, 12)
    with pytest.raises(ValueError, match="must rise"):
        GenerativeTraining(length_buckets=(8, 4))
    with pytest.raises(ValueError, match="by_length: true"):
        GenerativeTraining(by_length=False, length_buckets=(4,))


def test_a_temperature_below_one_sharpens_each_heads_softmax() -> None:
    """LETTER's ranking-guided loss: cross-entropy of logits / temperature; at the same logits a sharper softmax puts
    a larger loss on a target that is not ranked first."""
    from recsys.data.batching import HistoryBatch
    from recsys.training.recipes import GenerativeRecipe

    codes = catalog()
    m = model(codes, beam=4)  # eval mode: the same logits for every loss
    batch = HistoryBatch(torch.tensor([[0, 1, 2], [3, 4, 5]]), torch.tensor([6, 7]), torch.tensor([1, 2]))
    logits = m(batch.histories, batch.targets, batch.users)
    targets = codes[batch.targets]
    expected = torch.stack([F.cross_entropy(lg / 0.5, targets[:, t]) for t, lg in enumerate(logits)]).mean()
    sharp, _ = GenerativeRecipe(3, 2, temperature=0.5).loss(m, batch, torch.Generator())
    torch.testing.assert_close(sharp, expected)
    plain, _ = GenerativeRecipe(3, 2).loss(m, batch, torch.Generator())
    assert sharp.item() != plain.item()


def test_a_beam_wider_than_the_first_level_returns_every_item_then_padding() -> None:
    """Fewer first-level codes (4) than beams, and fewer items (5) than beams: the dead beams' prefixes are no valid
    keys; the search still returns each item once, best first, and pads the rest."""
    codes = catalog(num_items=5)
    m = model(codes, beam=8)
    items, scores = m.generate(torch.tensor([[1, 2], [0, 3]]), torch.tensor([1, 2]))
    assert items.shape == scores.shape == (2, 8)
    for b in range(2):
        assert sorted(items[b, :5].tolist()) == [1, 2, 3, 4, 5] and items[b, 5:].eq(0).all()
        assert torch.isfinite(scores[b, :5]).all() and scores[b, 5:].eq(float("-inf")).all()


def test_the_training_pass_compiles_to_one_graph() -> None:
    """No graph breaks (each is a host sync and a graph of its own): the level offsets are the config's, and the
    decoder is told its mask is causal instead of comparing it on the host."""
    from tests.conftest import compiled_recording_graphs

    levels = [(2, 4), (2, 3), (2, 2)]
    both = {"dense_weight": 1.0, "retrieval_candidates": 3}
    for item_heads, heads in (
        ({}, levels),
        ({"dense_weight": 1.0}, [*levels, (2, 15)]),
        (both, [*levels, *[(2, 15)] * 2]),
    ):
        torch._dynamo.reset()  # the other model's compiled forward is no graph of this one
        m = model(catalog(), beam=4, **item_heads).train()  # type: ignore[arg-type]
        compiled, graphs = compiled_recording_graphs(m)
        logits = compiled(torch.tensor([[1, 2, 3], [0, 4, 5]]), torch.tensor([6, 7]), torch.tensor([1, 2]))
        assert len(graphs) == 1 and [tuple(x.shape) for x in logits] == heads


def test_the_dense_head_is_one_more_head_and_rescores_the_beam() -> None:
    """Training: after the T levels' logits, the item logits of the query that follows the target's codes, and the
    item as that head's target. Generation: the beam's items ranked by their exact log-probability + dense_weight x
    their dense log-probability."""
    assert not hasattr(model(catalog(), beam=4), "item_emb")  # dense_weight 0: TIGER's model, no dense head
    m = model(catalog(), beam=6, dense_weight=0.5)
    histories, users, targets = torch.tensor([[0, 3, 4], [1, 1, 2]]), torch.tensor([3, 4]), torch.tensor([6, 7])
    logits = m.train()(histories, targets, users)
    assert [tuple(x.shape) for x in logits] == [(2, 4), (2, 3), (2, 2), (2, 15)]
    assert m.head_targets(targets).tolist() == [[*m.codes[6].tolist(), 6], [*m.codes[7].tolist(), 7]]
    m.eval()
    items, scores = m.generate(histories, users)
    exact = exact_log_probs(m, histories, users)
    memory, pad = m.encode(histories, users)
    dense = m.dense_log_probs(memory, pad, items)
    assert (dense <= 0).all() and torch.isfinite(dense).all()
    torch.testing.assert_close(scores, exact.gather(1, items) + 0.5 * dense, rtol=1e-4, atol=1e-4)
    assert (scores[:, :-1] >= scores[:, 1:]).all()
    assert m.dense_log_probs(memory, pad, torch.tensor([[0, 6], [7, 0]]))[[0, 1], [0, 1]].eq(float("-inf")).all()


def trained_on_one_batch(m: GenerativeRetriever) -> tuple[float, float, int, HistoryBatch]:
    """30 steps of the generative recipe on one batch of two users: the model's last head's cross-entropy on its
    targets before and after, the targets a step counted, and the batch."""
    from recsys.training.recipes import GenerativeRecipe

    batch = HistoryBatch(torch.tensor([[0, 3, 4], [1, 1, 2]]), torch.tensor([6, 7]), torch.tensor([3, 4]))
    optimizer = torch.optim.Adam(m.train().parameters(), lr=1e-2)

    def last_head_loss() -> float:
        return float(F.cross_entropy(m(batch.histories, batch.targets, batch.users)[-1], batch.targets))

    before = last_head_loss()
    for _ in range(30):
        loss, n = GenerativeRecipe(max_history=3, batch_size=2).loss(m, batch, torch.Generator())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return before, last_head_loss(), n, batch


def test_the_dense_head_learns_its_targets() -> None:
    before, after, n, _ = trained_on_one_batch(model(catalog(), beam=6, dense_weight=1.0))
    assert n == 2 and after < 0.5 * before


def test_the_retrieval_head_adds_items_the_beam_missed_scored_by_both_heads() -> None:
    """Training: after the levels' (and the dense head's) logits, the item logits of the decoder's start state, and the
    item as its target. Generation: the beam's W items and the retrieval head's best K, no item twice, each scored
    by its exact log-probability + retrieval_weight x its retrieval log-probability; the best W kept."""
    assert not hasattr(model(catalog(), beam=4), "retrieval_item_emb")  # 0 candidates: no retrieval head
    m = model(catalog(), beam=3, dense_weight=0.5, retrieval_candidates=5, retrieval_weight=0.7)
    histories, users, targets = torch.tensor([[0, 3, 4], [1, 1, 2]]), torch.tensor([3, 4]), torch.tensor([6, 7])
    logits = m.train()(histories, targets, users)
    assert [tuple(x.shape) for x in logits] == [(2, 4), (2, 3), (2, 2), (2, 15), (2, 15)]
    assert m.head_targets(targets).tolist() == [[*m.codes[6].tolist(), 6, 6], [*m.codes[7].tolist(), 7, 7]]
    m.eval()
    items, scores = m.generate(histories, users)
    assert items.shape == (2, 3) and all(len(set(row)) == 3 for row in items.tolist())
    memory, pad = m.encode(histories, users)
    beam = m._beam_search(memory, pad, "all", 3)[0]
    more, retrieval = m.retrieved(memory, pad, beam)
    top5 = retrieval.topk(5, dim=1).indices
    assert not torch.isin(items, beam).all(), "no item from the retrieval head ranked: the case tests nothing"
    for b in range(2):  # the candidates: the beam's items and the retrieval head's best 5, once each
        candidates = sorted(set(beam[b].tolist()) | set(top5[b].tolist()))
        assert sorted({*beam[b].tolist(), *more[b].tolist()} - {0}) == candidates
        pool = torch.tensor([candidates])
        expected = (
            exact_log_probs(m, histories[b : b + 1], users[b : b + 1]).gather(1, pool)
            + 0.7 * retrieval[b : b + 1].gather(1, pool)
            + 0.5 * m.dense_log_probs(memory[b : b + 1], pad[b : b + 1], pool)
        )
        best, order = expected.sort(dim=1, descending=True)
        assert items[b].tolist() == pool[0, order[0, :3]].tolist()
        torch.testing.assert_close(scores[b], best[0, :3], rtol=1e-4, atol=1e-4)
    assert retrieval[:, 0].eq(float("-inf")).all()


def test_the_retrieval_head_is_refused_beside_new_item_slots() -> None:
    with pytest.raises(ValueError, match=r"retrieval_candidates with new_item_slots.*set one of the two to 0"):
        model(catalog(), beam=4, new_item_slots=1, retrieval_candidates=3)


def test_the_retrieval_head_learns_its_targets() -> None:
    m = model(catalog(), beam=6, retrieval_candidates=4)
    before, after, _, batch = trained_on_one_batch(m)
    assert after < 0.5 * before
    m.eval()
    memory, pad = m.encode(batch.histories, batch.users)
    _, retrieval = m.retrieved(memory, pad, torch.zeros(2, 1, dtype=torch.long))
    assert retrieval.argmax(dim=1).tolist() == [6, 7]  # each user's target is the head's best item


def test_a_held_out_twin_never_trains_on_each_users_last_items() -> None:
    """holdout_last: the generative recipe's pairs stop before each row's last items (what a ranker learns on when
    the generative retriever is one of its candidate sources), and the rest are the plain recipe's pairs."""
    from recsys.training.recipes import GenerativeRecipe

    items = Jagged.from_lists([[1, 2, 3, 4], [5, 6, 7], [8, 9]])
    rows = TrainingRows(items, Jagged.from_lengths(torch.arange(len(items.values)), items.lengths()))

    def targets(recipe: Any) -> list[int]:
        return sorted(
            t for batch in recipe.batches(rows, torch.Generator().manual_seed(0)) for t in batch.targets.tolist()
        )

    assert targets(GenerativeRecipe(max_history=3, batch_size=2)) == [2, 3, 4, 6, 7, 9]
    assert targets(GenerativeRecipe(max_history=3, batch_size=2, holdout_last=1)) == [2, 3, 6]


COUNTS = torch.tensor([0, 500, 0, 3, 40, 7, 0, 1, 90, 2, 12, 5, 0, 30, 8])  # (V+1,) skewed training counts


def test_the_popularity_correction_takes_alpha_times_each_items_log_share_of_the_counts() -> None:
    histories, users = torch.tensor([[0, 0, 3, 4], [0, 0, 0, 0], [1, 2, 3, 4]]), torch.tensor([3, 0, 9])
    exact = exact_log_probs(model(catalog(), beam=14), histories, users)  # alpha 0: the same weights (seeded)
    log_share = ((COUNTS + 1) / (COUNTS[1:] + 1).sum()).log()
    for alpha in (0.5, 1.0):
        m = model(catalog(), beam=14, popularity_correction=alpha)
        m.set_item_counts(COUNTS)
        items, scores = m.generate(histories, users)  # a full beam: every item, its score exact
        memory, pad = m.encode(histories, users)
        for b in range(len(histories)):
            assert sorted(items[b].tolist()) == list(range(1, 15))
            want = exact[b, items[b]] - alpha * log_share[items[b]]
            torch.testing.assert_close(scores[b], want, rtol=1e-4, atol=1e-4)
            assert (scores[b][:-1] >= scores[b][1:]).all()
        torch.testing.assert_close(m.sequence_log_probs(memory, pad, items), scores, rtol=1e-4, atol=1e-4)
    # the most trained item (1: 500 of 716) loses the most: it falls in a user's list, or was last already
    plain, _ = model(catalog(), beam=14).generate(histories, users)
    before, after = (plain == 1).float().argmax(dim=1), (items == 1).float().argmax(dim=1)
    assert bool(((after > before) | (before == 13)).all()) and bool((after > before).any()), (before, after)


def test_the_popularity_correction_keeps_the_new_items_slots_comparable() -> None:
    new = torch.zeros(15, dtype=torch.bool)
    new[[2, 6, 12]] = True  # never trained: count 0, weight 1
    histories, users = torch.tensor([[0, 3, 4], [1, 1, 2]]), torch.tensor([3, 4])
    m = model(catalog(), beam=6, new_item_slots=2, popularity_correction=1.0)
    m.set_item_counts(COUNTS)
    m.mark_new_items(new)
    items, scores = m.generate(histories, users)
    memory, pad = m.encode(histories, users)
    for b in range(2):
        assert len(set(items[b].tolist())) == 6 and sum(bool(new[i]) for i in items[b]) == 2
    torch.testing.assert_close(scores, m.sequence_log_probs(memory, pad, items), rtol=1e-4, atol=1e-4)


def test_the_popularity_correction_reads_the_training_counts_and_keeps_them_with_the_model() -> None:
    from recsys.models.family import Input, ModelInputs
    from recsys.models.generative import FAMILY
    from recsys.semantic_ids.codes import SemanticIds

    fields = {"num_items": 14, "dim": 16, "num_heads": 2, "ffn_dim": 32, "num_encoder_layers": 1,
              "num_decoder_layers": 1, "beam_size": 4, "popularity_correction": 0.5}  # fmt: skip
    sids = SemanticIds(torch.cat([torch.full((1, 3), -1), catalog()[1:]]), SIZES)
    assert Input.ITEM_COUNTS in FAMILY.reads(FAMILY.validate({**fields, "codebook_sizes": SIZES}))
    off = FAMILY.validate({**fields, "codebook_sizes": SIZES, "popularity_correction": 0.0})
    assert Input.ITEM_COUNTS not in FAMILY.reads(off)
    with pytest.raises(ValueError, match=r"popularity_correction needs the training counts .*Input.ITEM_COUNTS"):
        FAMILY.build(fields, ModelInputs(semantic_ids=sids))
    built = FAMILY.build(fields, ModelInputs(semantic_ids=sids, item_counts=COUNTS))
    assert isinstance(built, GenerativeRetriever) and torch.equal(built.item_weights, COUNTS + 1.0)
    with pytest.raises(ValueError, match="popularity_correction is 0"):
        model(catalog(), beam=4).set_item_counts(COUNTS)
    with pytest.raises(ValueError, match=r"item counts must be \(V\+1,\) = \(15,\)"):
        model(catalog(), beam=4, popularity_correction=0.5).set_item_counts(COUNTS[:-1])
    trained = model(catalog(), beam=4, popularity_correction=0.5)
    trained.set_item_counts(COUNTS)
    loaded = GenerativeRetriever(trained.config, torch.zeros_like(catalog())).eval()  # as a model dir's is shaped
    loaded.load_state_dict(trained.state_dict())
    histories = torch.tensor([[0, 3, 4], [5, 6, 7]])
    assert torch.equal(loaded.generate(histories)[0], trained.generate(histories)[0])
    assert torch.equal(loaded.item_weights, COUNTS + 1.0)


def test_a_trained_model_decodes_with_a_popularity_correction_chosen_afterwards() -> None:
    histories, users = torch.tensor([[0, 0, 3, 4], [1, 2, 3, 4]]), torch.tensor([3, 9])
    trained = model(catalog(), beam=14)  # alpha 0
    built = model(catalog(), beam=14, popularity_correction=0.5)  # the same weights (seeded), built with alpha
    built.set_item_counts(COUNTS)
    corrected = trained.with_decoding(COUNTS, popularity_correction=0.5, retrieval_weight=1.0, retrieval_candidates=0)
    assert not corrected.training and corrected.token_emb.weight is trained.token_emb.weight  # shared, not copied
    for got, want in zip(corrected.generate(histories, users), built.generate(histories, users), strict=True):
        torch.testing.assert_close(got, want)
    back = corrected.with_decoding(COUNTS, popularity_correction=0.0, retrieval_weight=1.0, retrieval_candidates=0)
    for got, want in zip(back.generate(histories, users), trained.generate(histories, users), strict=True):
        torch.testing.assert_close(got, want)


def test_a_trained_model_decodes_with_a_retrieval_weight_and_candidates_chosen_afterwards() -> None:
    histories, users = torch.tensor([[0, 0, 3, 4], [1, 2, 3, 4]]), torch.tensor([3, 9])
    trained = model(catalog(), beam=4, retrieval_candidates=6)  # weight 1
    for weight, candidates in ((3.0, 6), (1.0, 2), (0.5, 10)):
        built = model(catalog(), beam=4, retrieval_candidates=candidates, retrieval_weight=weight)  # seeded alike
        changed = trained.with_decoding(COUNTS, popularity_correction=0.0, retrieval_weight=weight,
                                        retrieval_candidates=candidates)  # fmt: skip
        assert changed.retrieval_item_emb.weight is trained.retrieval_item_emb.weight  # shared, not copied
        got, want = changed.generate(histories, users), built.generate(histories, users)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)
        if weight != 1.0:
            assert not torch.equal(got[1], trained.generate(histories, users)[1])  # the weight changes the scores
    beam_order = trained.with_decoding(COUNTS, popularity_correction=0.0, retrieval_weight=0.0,
                                       retrieval_candidates=13)  # fmt: skip
    items, scores = beam_order.generate(histories, users)  # every item a candidate, most of them repeats
    memory, pad = trained.encode(histories, users)
    torch.testing.assert_close(scores, trained.sequence_log_probs(memory, pad, items))  # ranked by the beam alone
    assert bool((items != 0).all()) and not bool(scores.isnan().any())
    with pytest.raises(ValueError, match=r"need the retrieval head \(retrieval_candidates > 0\)"):
        model(catalog(), beam=4).with_decoding(COUNTS, popularity_correction=0.0, retrieval_weight=3.0,
                                               retrieval_candidates=0)  # fmt: skip
    with pytest.raises(ValueError, match=r"retrieval_candidates 0 with the retrieval head: give 1 or more"):
        trained.with_decoding(COUNTS, popularity_correction=0.0, retrieval_weight=1.0, retrieval_candidates=0)
