"""Distillation: the KL loss, the recipe's mix with the next-item loss, the packed targets' indices and the teacher's
top-K cache (its key decides reuse)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from recsys.data.batching import packed_next_item_batches
from recsys.data.jagged import Jagged
from recsys.data.prepared import TrainingRows
from recsys.inference import top_k
from recsys.models.sasrec import SASRec, SASRecConfig
from recsys.training.losses import distillation_kl
from recsys.training.recipes import DistillationRecipe, DistillConfig, NextItemRecipe
from recsys.training.teacher import TeacherScoring, TeacherTopK, cached_teacher_topk, teacher_key, teacher_topk

NUM_ITEMS = 12
SEQUENCES = [[1, 2, 3, 4, 5], [6, 7], [8], [2, 9, 10, 11, 12, 3, 4]]


def _rows() -> TrainingRows:
    items = Jagged.from_lists(SEQUENCES)
    return TrainingRows(items, Jagged.from_lengths(torch.arange(len(items.values)), items.lengths()))


def _sasrec(seed: int, dim: int = 8) -> SASRec:
    torch.manual_seed(seed)
    return SASRec(SASRecConfig(num_items=NUM_ITEMS, max_history=4, dim=dim, num_heads=1, ffn_dim=16)).eval()


def _scoring(key: str = "k", k: int = 3) -> TeacherScoring:
    return TeacherScoring(key, k, torch.ones(NUM_ITEMS + 1, dtype=torch.bool), batch_size=2)


def test_kl_matches_a_hand_computation() -> None:
    teacher, student, t = [1.0, 0.0, -1.0], [0.5, 0.5, 0.0], 2.0
    p = [math.exp(s / t) / sum(math.exp(x / t) for x in teacher) for s in teacher]
    q = [math.exp(s / t) / sum(math.exp(x / t) for x in student) for s in student]
    expected = t**2 * sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))
    valid = torch.ones(1, 3, dtype=torch.bool)
    got = distillation_kl(torch.tensor([student]), torch.tensor([teacher]), valid, t)
    assert float(got) == pytest.approx(expected, rel=1e-5)


def test_kl_leaves_out_invalid_candidates_and_is_zero_where_the_student_matches() -> None:
    scores = torch.tensor([[3.0, 1.0, float("-inf")], [0.2, -0.4, 1.5]])
    valid = scores.isfinite()
    student = torch.tensor([[3.0, 1.0, 7.0], [0.2, -0.4, 1.5]], requires_grad=True)  # 7.0: not a candidate
    loss = distillation_kl(student, scores, valid, 1.5)
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    assert student.grad is not None and bool(student.grad.isfinite().all())
    assert float(student.grad[0, 2]) == 0.0


def test_packed_targets_carry_their_index_in_the_rows() -> None:
    items = Jagged.from_lists(SEQUENCES)
    batches = list(packed_next_item_batches(items, 4, 2, torch.Generator().manual_seed(1), index_targets=True))
    seen = []
    for batch in batches:
        assert batch.target_index is not None
        real = batch.targets != 0
        assert torch.equal(items.values[batch.target_index[real]], batch.targets[real])
        seen += batch.target_index[real].tolist()
    # every user's last 4 targets (the row width), each once
    expected = [j for row in range(len(items)) for j in range(int(items.offsets[row]) + 1, int(items.offsets[row + 1]))]
    expected = [j for j in expected if j >= int(items.offsets[_row_of(items, j) + 1]) - 4]
    assert sorted(seen) == expected


def _row_of(items: Jagged, j: int) -> int:
    return int(torch.searchsorted(items.offsets, torch.tensor(j), right=True)) - 1


def test_teacher_topk_is_the_teachers_ranking_of_each_targets_history() -> None:
    teacher, rows = _sasrec(0), _rows()
    cache = teacher_topk(teacher, rows, torch.arange(1, 5), _scoring(k=3))
    values = rows.items.values
    for j in (1, 4, 6, 12):  # targets: user 0's 2nd and last, user 1's, user 3's last (history cut to 4)
        row = _row_of(rows.items, j)
        history = values[max(int(rows.items.offsets[row]), j - 4) : j]
        scores = teacher.score(history[None, :]).detach()
        scores[:, 0] = float("-inf")
        best, items = top_k(scores, 3)
        assert torch.equal(cache.items[j].long(), items[0]) and torch.allclose(cache.scores[j], best[0])
    firsts = rows.items.offsets[:-1]
    assert bool((cache.items[firsts] == 0).all()), "a row's first value has no history: no candidates"


def test_cache_is_reused_for_its_key_and_recomputed_for_another(tmp_path: Path) -> None:
    rows, calls = _rows(), []
    teacher = _sasrec(0)

    class Counting:
        max_history = teacher.max_history

        def score(self, *args: object) -> torch.Tensor:
            calls.append(1)
            return teacher.score(*args)  # type: ignore[arg-type]

    candidates = torch.ones(NUM_ITEMS + 1, dtype=torch.bool)
    key = teacher_key("sha-a", rows, candidates, 3, 4)
    first = cached_teacher_topk(tmp_path, Counting(), rows, torch.arange(1, 5), _scoring(key))
    scored = len(calls)
    again = cached_teacher_topk(tmp_path, Counting(), rows, torch.arange(1, 5), _scoring(key))
    assert len(calls) == scored, "an unchanged teacher, data and K scored again"
    assert torch.equal(again.items, first.items) and torch.equal(again.scores, first.scores)
    changed = {
        "teacher": teacher_key("sha-b", rows, candidates, 3, 4),
        "k": teacher_key("sha-a", rows, candidates, 5, 4),
        "history": teacher_key("sha-a", rows, candidates, 3, 2),
        "data": teacher_key("sha-a", rows.truncate_last(1), candidates, 3, 4),
    }
    assert len({key, *changed.values()}) == 5
    other = cached_teacher_topk(tmp_path, Counting(), rows, torch.arange(1, 5), _scoring(changed["k"], k=5))
    assert len(calls) > scored and other.top_k == 5
    assert TeacherTopK.load(tmp_path, key) is None, "the directory now holds the recomputed cache"


@pytest.mark.parametrize("sampling", [False, True])
def test_alpha_zero_is_the_next_item_loss_exactly(sampling: bool) -> None:
    rows, student = _rows(), _sasrec(1).train()
    probs = torch.cat([torch.zeros(1), torch.full((NUM_ITEMS,), 1.0 / NUM_ITEMS)]) if sampling else None
    next_item = NextItemRecipe(max_history=4, rows_per_batch=4, sampling_probs=probs, num_negatives=5)
    cache = teacher_topk(_sasrec(0), rows, torch.arange(1, 5), _scoring(k=4))
    distill = DistillationRecipe.create(next_item, cache, DistillConfig(Path("t"), top_k=4, alpha=0.0))
    batch = distill.batches(rows, torch.Generator().manual_seed(0))[0]
    torch.manual_seed(2)  # dropout
    plain, n = next_item.loss(student, batch, torch.Generator().manual_seed(3))
    torch.manual_seed(2)
    mixed, m = distill.loss(student, batch, torch.Generator().manual_seed(3))
    assert n == m and torch.equal(plain, mixed)


def test_alpha_one_is_zero_where_the_students_logits_are_the_teachers_scores() -> None:
    rows, student = _rows(), _sasrec(5)
    next_item = NextItemRecipe(max_history=4, rows_per_batch=4)
    draws = torch.Generator().manual_seed(0)
    candidates = torch.randint(1, NUM_ITEMS + 1, (len(rows.items.values), 4), generator=draws)
    flat = TeacherTopK(candidates.int(), torch.zeros(len(candidates), 4), "flat")
    settings = DistillConfig(Path("t"), top_k=4, alpha=1.0)
    batch = DistillationRecipe.create(next_item, flat, settings).batches(rows, torch.Generator().manual_seed(0))[0]
    assert batch.target_index is not None
    hidden, _ = next_item.hidden_states(student, batch)
    index = batch.target_index[batch.targets != 0]
    scores = torch.zeros(len(candidates), 4)
    scores[index] = (student.item_embeddings()[candidates[index]] @ hidden[:, :, None]).squeeze(-1).detach()
    matched = DistillationRecipe.create(next_item, TeacherTopK(candidates.int(), scores, "matched"), settings)
    loss, _ = matched.loss(student, batch, torch.Generator())
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    flat_loss, _ = DistillationRecipe.create(next_item, flat, settings).loss(student, batch, torch.Generator())
    assert flat_loss.item() > 1e-3


@pytest.mark.parametrize(
    ("file", "corrupt", "problem"),
    [
        ("meta.json", lambda p: p.write_bytes(p.read_bytes()[:10]), "meta.json: not valid JSON"),
        ("meta.json", lambda p: p.write_text("[]"), "meta.json: holds a JSON list"),
        ("items.npy", lambda p: p.write_bytes(p.read_bytes()[:100]), "items.npy: not a readable .npy array"),
        ("scores.npy", lambda p: p.write_bytes(b"not an array"), "scores.npy: not a readable .npy array"),
        ("scores.npy", lambda p: np.save(p, np.zeros((2, 3), np.float32)), "are not (P, K) int32 and float32"),
    ],
)
def test_a_teacher_cache_that_does_not_read_is_computed_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, file: str, corrupt: Callable[[Path], object], problem: str
) -> None:
    cache = tmp_path / "teacher"
    TeacherTopK(torch.arange(12, dtype=torch.int32).reshape(4, 3), torch.zeros(4, 3), "key").save(cache)
    assert TeacherTopK.load(cache, "key") is not None
    corrupt(cache / file)
    assert TeacherTopK.load(cache, "key") is None  # what cached_teacher_topk then computes and saves again
    assert problem in caplog.text and "computed again" in caplog.text
