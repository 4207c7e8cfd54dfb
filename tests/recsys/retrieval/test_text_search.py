"""BM25 (real bm25s) and dense text search (real MiniLM, real FAISS Flat index) over a small catalogue: a query equal
to an item's title finds that item first, the padding column is never ranked, and an empty query is refused with
the fix."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from recsys.retrieval.lexical import BM25Config, BM25Retriever
from recsys.retrieval.text import DenseTextRetriever, QueryEmbedder
from recsys.semantic_ids.content import ContentConfig, embed_texts

TITLES = [
    "Matte Red Lipstick for Women",
    "Hydrating Lavender Shampoo",
    "Volumising Black Mascara",
    "Gentle Citrus Conditioner with Argan Oil",
    "Coral Blush Palette",
    "Waterproof Brown Eyeliner Pencil",
]
CONTENT = ContentConfig(text_fields=("title",), progress=False)


@pytest.fixture(scope="module")
def dense() -> DenseTextRetriever:
    embed = QueryEmbedder(CONTENT)
    return DenseTextRetriever(embed_texts(TITLES, CONTENT, encoder=embed.encoder), embed)


def test_bm25_finds_each_title_first_and_never_the_padding() -> None:
    bm25 = BM25Retriever(TITLES)
    scores = bm25.score(TITLES)
    assert scores.shape == (len(TITLES), len(TITLES) + 1) and bool(torch.isneginf(scores[:, 0]).all())
    assert scores[:, 1:].argmax(dim=1).add(1).tolist() == list(range(1, len(TITLES) + 1))
    _, ids = bm25.search(["lipstick", "argan oil conditioner"], k=len(TITLES))
    assert ids[:, 0].tolist() == [1, 4] and bool((ids > 0).all())


def test_bm25_drops_english_stopwords_unless_told_not_to() -> None:
    assert not BM25Retriever(TITLES).score(["for with"])[:, 1:].any()  # no item for "for" / "with" alone
    kept = BM25Retriever(TITLES, BM25Config(stopwords=None)).score(["for with"])
    assert kept[0, 1:].nonzero().flatten().add(1).tolist() == [1, 4]


def test_dense_finds_each_title_first_through_the_faiss_index(dense: DenseTextRetriever) -> None:
    scores = dense.score(TITLES)
    assert scores.shape == (len(TITLES), len(TITLES) + 1) and bool(torch.isneginf(scores[:, 0]).all())
    assert scores[:, 1:].argmax(dim=1).add(1).tolist() == list(range(1, len(TITLES) + 1))
    torch.testing.assert_close(scores[:, 1:].diagonal(), torch.ones(len(TITLES)), atol=1e-4, rtol=0)  # cosine 1
    top, ids = dense.search(["shampoo with lavender"], k=3)
    assert ids[0, 0].item() == 2 and ids.min() >= 1 and bool((top[0, :-1] >= top[0, 1:]).all())
    assert dense.index.report is not None and dense.index.report.kind == "flat"


@pytest.mark.parametrize("queries", [["lipstick", "  "], [""]])
def test_an_empty_query_is_refused_with_the_fix(dense: DenseTextRetriever, queries: list[str]) -> None:
    for search in (BM25Retriever(TITLES).score, dense.score):
        with pytest.raises(ValueError, match=r"is empty .* Fix: leave out the users without a query"):
            search(queries)


def test_bm25s_is_imported_on_first_use_with_jax_kept_off_the_gpu() -> None:
    """bm25s runs JAX at import where JAX is installed, and JAX on a GPU takes 75 % of its memory: importing the
    models must not import it, and using BM25 leaves JAX on the CPU unless the caller chose otherwise."""
    script = (
        "import os, sys\n"
        "import recsys.models.registry\n"
        "assert 'bm25s' not in sys.modules, 'the registry imported bm25s'\n"
        "from recsys.retrieval.lexical import BM25Retriever\n"
        "BM25Retriever(['red lipstick'])\n"
        "assert 'bm25s' in sys.modules\n"
        "print(os.environ['JAX_PLATFORMS'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    chosen = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert chosen.stdout.strip() == "cpu"
    kept = subprocess.run([sys.executable, "-c", script], env={**env, "JAX_PLATFORMS": "cuda"}, capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert kept.stdout.strip() == "cuda"
