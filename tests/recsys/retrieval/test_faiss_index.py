"""Retrieval: exact torch top-k against numpy, FAISS indexes against exact (real FAISS indexes, small data)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from recsys.errors import BudgetExceeded
from recsys.retrieval import ExactTopK, IndexConfig, recall_at_k
from recsys.retrieval.faiss_index import FaissTopK, build_index


def clustered_vectors(num: int, dim: int, seed: int = 0) -> torch.Tensor:
    """Unit vectors around 20 centres: the shape of learned item embeddings (uniform noise is ANN's worst case)."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(20, dim, generator=gen)
    points = centres[torch.randint(0, 20, (num,), generator=gen)] + 0.5 * torch.randn(num, dim, generator=gen)
    return torch.nn.functional.normalize(points, dim=1)


VECTORS = clustered_vectors(3_000, 16)
IDS = torch.arange(3_000) * 10 + 5  # ids that are not positions
QUERIES = clustered_vectors(50, 16, seed=1)


@pytest.mark.parametrize("metric", ["ip", "l2"])
def test_exact_topk_matches_numpy(metric: str) -> None:
    scores, ids = ExactTopK(VECTORS, IDS, metric, chunk_size=7).search(QUERIES, 20)  # type: ignore[arg-type]
    q, v = QUERIES.double().numpy(), VECTORS.double().numpy()
    full = q @ v.T if metric == "ip" else -((q[:, None, :] - v[None, :, :]) ** 2).sum(-1)
    order = np.argsort(-full, axis=1, kind="stable")[:, :20]
    np.testing.assert_allclose(scores.numpy(), np.take_along_axis(full, order, 1), rtol=1e-5, atol=1e-5)
    assert recall_at_k(ids, torch.from_numpy(IDS.numpy()[order])) == 1.0
    assert scores.dtype == torch.float32 and ids.dtype == torch.int64


@pytest.mark.parametrize(
    ("config", "min_recall"),
    [
        (IndexConfig(kind="flat"), 1.0),
        (IndexConfig(kind="ivf_flat", nlist=16, nprobe=4), 0.9),
        (IndexConfig(kind="hnsw", hnsw_m=16, ef_search=64), 0.9),
        (IndexConfig(kind="ivf_pq", nlist=16, nprobe=16, pq_m=8, pq_nbits=4), 0.2),
        (IndexConfig(kind="ivf_pq", nlist=16, nprobe=16, pq_m=8, pq_nbits=4, fast_scan=True), 0.2),
        (IndexConfig(kind="ivf_pq", nlist=16, nprobe=16, pq_m=8, pq_nbits=4, fast_scan=True, refine_k_factor=8), 0.9),
        (IndexConfig(kind="ivf_flat", metric="l2", nlist=16, nprobe=4), 0.9),
    ],
)
def test_faiss_indexes_report_their_recall_against_exact(config: IndexConfig, min_recall: float) -> None:
    index = build_index(VECTORS, IDS, config, eval_queries=QUERIES, eval_k=20)
    assert index.report is not None and index.report.k == 20 and index.report.eval_queries == 50
    exact_ids = ExactTopK(VECTORS, IDS, config.metric).search(QUERIES, 20)[1]
    scores, ids = index.search(QUERIES, 20)
    assert recall_at_k(ids, exact_ids) == pytest.approx(index.report.recall)
    assert index.report.recall >= min_recall
    assert set(ids[ids >= 0].tolist()) <= set(IDS.tolist())
    assert bool((scores[:, :-1] >= scores[:, 1:] - 1e-6).all()), "results must come best first"


def test_ivf_pq_recall_is_below_exact_and_flat_is_exact() -> None:
    """The recall check can tell a lossy index from an exact one (it is not always 1.0)."""
    pq = build_index(VECTORS, IDS, IndexConfig(kind="ivf_pq", nlist=16, nprobe=16, pq_m=2, pq_nbits=4), eval_k=20)
    flat = build_index(VECTORS, IDS, IndexConfig(kind="flat"), eval_k=20)
    assert pq.report is not None and flat.report is not None
    assert flat.report.recall == 1.0 and pq.report.recall < 0.9


def test_refine_reranks_pq_candidates_by_exact_scores() -> None:
    """Re-ranking k * factor fast-scan candidates by their exact scores: scores are the exact inner products, recall
    grows with the factor, and a saved index keeps its factor."""
    config = IndexConfig(kind="ivf_pq", nlist=16, nprobe=16, pq_m=2, pq_nbits=4, fast_scan=True, refine_k_factor=1)
    index = build_index(VECTORS, IDS, config, eval_queries=QUERIES, eval_k=20)
    exact_ids = ExactTopK(VECTORS, IDS).search(QUERIES, 20)[1]
    assert index.report is not None and index.report.recall < 0.9  # 2 sub-quantizers of 4 bits: coarse codes
    index.set_search_params(refine_k_factor=16)
    scores, ids = index.search(QUERIES, 20)
    assert recall_at_k(ids, exact_ids) > index.report.recall + 0.1
    exact_scores = (QUERIES[:, None, :] * VECTORS[torch.searchsorted(IDS, ids)]).sum(-1)  # (B, k) q . v of each id
    torch.testing.assert_close(scores, exact_scores, rtol=1e-5, atol=1e-5)
    unrefined = build_index(VECTORS, IDS, IndexConfig(kind="ivf_pq", nlist=16, nprobe=16, pq_m=2, pq_nbits=4,
                                                      fast_scan=True), eval_k=20)  # fmt: skip
    assert not torch.allclose(unrefined.search(QUERIES, 20)[0], ExactTopK(VECTORS, IDS).search(QUERIES, 20)[0])


def test_refine_factor_survives_save_and_load(tmp_path: Path) -> None:
    config = IndexConfig(kind="ivf_pq", nlist=16, nprobe=4, pq_m=4, pq_nbits=4, fast_scan=True, refine_k_factor=3)
    index = build_index(VECTORS, IDS, config, eval_k=10)
    loaded = FaissTopK.load(index.save(tmp_path / "index"))
    assert loaded.config.refine_k_factor == 3 and loaded.report == index.report
    for a, b in zip(loaded.search(QUERIES, 10), index.search(QUERIES, 10), strict=True):
        assert torch.equal(a, b)


def test_the_training_sample_is_reported() -> None:
    ivf = build_index(VECTORS, IDS, IndexConfig(kind="ivf_flat", nlist=16, train_size=1_000), eval_k=10)
    hnsw = build_index(VECTORS, IDS, IndexConfig(kind="hnsw", hnsw_m=8), eval_k=10)
    assert ivf.report is not None and ivf.report.train_vectors == 1_000
    assert hnsw.report is not None and hnsw.report.train_vectors == 0  # HNSW trains nothing


@pytest.mark.parametrize(
    ("config", "stage"),
    [
        (IndexConfig(kind="ivf_pq", nlist=16, pq_m=8, pq_nbits=4, fast_scan=True, train_size=1_000,
                     max_build_seconds=1e-9), "after training on 1,000 sampled vectors"),
        (IndexConfig(kind="hnsw", hnsw_m=8, max_build_seconds=1e-9), "after adding 3,000 of 3,000 vectors"),
    ],
)  # fmt: skip
def test_a_build_past_its_budget_stops_naming_the_knob(config: IndexConfig, stage: str, tmp_path: Path) -> None:
    with pytest.raises(BudgetExceeded) as raised:
        build_index(VECTORS, IDS, config)
    message = str(raised.value)
    assert message.startswith(f"building the {config.kind}") and stage in message
    assert "over its time budget of" in message and "raise max_build_seconds" in message
    assert build_index(VECTORS, IDS, IndexConfig(kind="hnsw", hnsw_m=8, max_build_seconds=600), eval_k=10).report


def test_nprobe_trades_recall_for_speed_and_missing_results_are_marked() -> None:
    index = build_index(VECTORS, IDS, IndexConfig(kind="ivf_flat", nlist=64, nprobe=1), eval_queries=QUERIES, eval_k=50)
    exact_ids = ExactTopK(VECTORS, IDS).search(QUERIES, 200)[1]
    few = recall_at_k(index.search(QUERIES, 200)[1], exact_ids)
    index.set_search_params(nprobe=64)  # every cell: exact
    assert recall_at_k(index.search(QUERIES, 200)[1], exact_ids) == 1.0 > few
    index.set_search_params(nprobe=1)
    scores, ids = index.search(QUERIES[:1], 3_000)  # one cell cannot hold every item
    missing = ids == -1
    assert bool(missing.any()) and bool(torch.isinf(scores[missing]).all()) and not bool(missing[:, 0].any())


def test_saved_index_loads_and_searches_the_same(tmp_path: Path) -> None:
    index = build_index(VECTORS, IDS, IndexConfig(kind="hnsw", hnsw_m=8, ef_search=32), eval_k=10)
    out = index.save(tmp_path / "index")
    loaded = FaissTopK.load(out)
    assert loaded.config == index.config and loaded.report == index.report
    for a, b in zip(loaded.search(QUERIES, 10), index.search(QUERIES, 10), strict=True):
        assert torch.equal(a, b)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"], "no temporary directory left behind"
    index.save(out)  # overwriting its own output is allowed
    with pytest.raises(FileNotFoundError, match="build one with build_index"):
        FaissTopK.load(tmp_path)


def test_hnsw_returns_k_results_even_above_ef_search() -> None:
    index = build_index(VECTORS, IDS, IndexConfig(kind="hnsw", hnsw_m=8, ef_search=16), eval_k=10)
    _, ids = index.search(QUERIES, 64)
    assert bool((ids >= 0).all()) and index.config.ef_search == 16


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: build_index(VECTORS, config=IndexConfig(kind="ivf_pq", pq_m=5)),
            "pq_m=5 must divide the vector dim 16",
        ),
        (lambda: IndexConfig(kind="annoy"), "index kind must be"),  # type: ignore[arg-type]
        (lambda: IndexConfig(nprobe=0), "nprobe must be >= 1"),
        (lambda: IndexConfig(kind="ivf_pq", fast_scan=True), "fast_scan needs pq_nbits: 4"),
        (lambda: IndexConfig(kind="hnsw", refine_k_factor=2), "apply to kind ivf_pq"),
        (lambda: IndexConfig(kind="ivf_flat", fast_scan=True), "apply to kind ivf_pq"),
        (lambda: IndexConfig(kind="ivf_pq", refine_k_factor=0.5), "refine_k_factor must be >= 1"),
        (lambda: IndexConfig(max_build_seconds=0), "max_build_seconds must be > 0"),
        (lambda: build_index(VECTORS, config=IndexConfig(kind="ivf_flat", nlist=0)), "nlist must be in"),
        (lambda: ExactTopK(VECTORS).search(QUERIES, 3_001), r"k must be in \[1, 3000\]"),
        (lambda: ExactTopK(VECTORS).search(QUERIES[:, :8], 5), r"queries must be a \(B, 16\) float tensor"),
        (lambda: ExactTopK(VECTORS, torch.arange(5)), r"ids must be a \(3000,\) int64 tensor"),
        (lambda: recall_at_k(torch.zeros(2, 3), torch.zeros(2, 4)), "of one shape"),
    ],
)
def test_bad_inputs_say_what_to_fix(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]


def test_gpu_request_without_faiss_gpus_says_what_to_do() -> None:
    import faiss

    if faiss.get_num_gpus() > 0:
        pytest.skip("this faiss has GPUs: the request is valid here")
    with pytest.raises(ValueError, match="install faiss-gpu, or use device: cpu"):
        build_index(VECTORS, config=IndexConfig(kind="flat", device="gpu"))
    fast_scan = IndexConfig(kind="ivf_pq", nlist=16, pq_m=8, pq_nbits=4, fast_scan=True, device="gpu")
    with pytest.raises(ValueError, match="install faiss-gpu"):  # no GPUs is said first; then that it has no GPU kind
        build_index(VECTORS, config=fast_scan)
    assert math.isclose(build_index(VECTORS, config=IndexConfig(kind="flat", device="auto")).report.recall, 1.0)  # type: ignore[union-attr]


def test_mips_to_l2_finds_inner_product_neighbours_of_vectors_whose_norms_differ(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    directions = torch.nn.functional.normalize(torch.randn(20_000, 16, generator=generator), dim=1)
    vectors = directions * torch.rand(20_000, 1, generator=generator).pow(4) * 3  # a few long vectors, many short
    queries = torch.randn(200, 16, generator=generator)
    exact_scores, exact_ids = ExactTopK(vectors).search(queries, 10)
    flat = build_index(vectors, config=IndexConfig(kind="flat", mips_to_l2=True), eval_queries=queries, eval_k=10)
    scores, ids = flat.search(queries, 10)
    assert torch.equal(ids, exact_ids) and torch.allclose(scores, exact_scores, atol=1e-3)  # inner products back
    config = IndexConfig(kind="ivf_flat", nlist=64, nprobe=4, seed=0)
    plain = build_index(vectors, config=config, eval_queries=queries, eval_k=10)
    lifted = build_index(vectors, config=replace(config, mips_to_l2=True), eval_queries=queries, eval_k=10)
    assert plain.report is not None and lifted.report is not None
    assert lifted.report.recall > plain.report.recall + 0.05  # no clusters here: a hard case for IVF either way
    reloaded = FaissTopK.load(lifted.save(tmp_path / "lifted"))
    assert torch.equal(reloaded.search(queries, 10)[1], lifted.search(queries, 10)[1]) and reloaded.dim == 16
    with pytest.raises(ValueError, match=r"mips_to_l2 .* needs metric"):
        IndexConfig(metric="l2", mips_to_l2=True)
