"""Retrieval: exact torch top-k against numpy, FAISS indexes against exact (real FAISS indexes, small data)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

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
    assert math.isclose(build_index(VECTORS, config=IndexConfig(kind="flat", device="auto")).report.recall, 1.0)  # type: ignore[union-attr]
