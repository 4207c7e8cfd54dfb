"""What an enrichment run uses: the backend and its model, the prompt, the item text, and the run's bounds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from recsys.enrich.backend import DEFAULT_LOCAL_MODEL, Backend
from recsys.enrich.record import DEFAULT_PROMPT, check_prompt_version
from recsys.errors import ConfigError
from recsys.runtime.extras import optional


@dataclass(frozen=True)
class EnrichConfig:
    """The `enrich` section of an experiment config, and `recsys enrich`'s options.

    Attributes:
        backend: "local" (a model on this machine, guided decoding) or "http" (an OpenAI-compatible server).
        model: local: "gemma3-270m" (the packaged default), a .gguf file or a Hugging Face directory; http: the model
            name the server serves.
        url: the http server's base URL, e.g. http://127.0.0.1:8080/v1.
        api_key_env: the environment variable holding the http server's key (None: send none).
        prompt: the prompt version (recsys/enrich/prompts/).
        categories: the shop's category list (None: the prompt's general retail list).
        text_fields: the item columns that make an item's text (absent ones skipped; items without text are skipped).
        batch_size: items per local model call / per round of http requests (and per cache transaction).
        limit: most items asked in one run (None: all); the rest are left for the next run.
        records: an item_metadata.parquet written elsewhere (another machine, a GPU run: docs/enrich.md) whose
            answers seed the cache: an item whose text, prompt and model match one of them is not asked again.
        device, precision, threads: the local model's ("auto" = cuda when available).
        concurrency, requests_per_s, timeout_s, max_retries, token_budget, max_failures_in_a_row: the http backend's
            (recsys.enrich.http; timeout_s bounds one request in total, max_failures_in_a_row failed requests in a row
            stop the run).
    """

    backend: Literal["local", "http"] = "local"
    model: str = DEFAULT_LOCAL_MODEL
    url: str | None = None
    api_key_env: str | None = "OPENAI_API_KEY"
    prompt: str = DEFAULT_PROMPT
    categories: tuple[str, ...] | None = None
    text_fields: tuple[str, ...] = ("title", "brand", "category", "description")
    batch_size: int = 8
    limit: int | None = None
    records: str | None = None
    device: str = "auto"
    precision: Literal["fp32", "bf16"] = "fp32"
    threads: int | None = None
    concurrency: int = 4
    requests_per_s: float | None = None
    timeout_s: float = 60.0
    max_retries: int = 4
    token_budget: int | None = None
    max_failures_in_a_row: int = 8

    def __post_init__(self) -> None:
        check_prompt_version(self.prompt)
        if self.backend == "http" and not self.url:
            raise ConfigError("enrich.backend http needs enrich.url. Fix: e.g. url: http://127.0.0.1:8080/v1")
        if self.batch_size < 1 or (self.limit is not None and self.limit < 0):
            raise ConfigError("enrich.batch_size must be >= 1 and enrich.limit >= 0. Fix: correct them")


def make_backend(config: EnrichConfig, cache_dir: Path) -> Backend:
    """The backend `config` names (a local model is loaded, converted once if it is a GGUF file)."""
    if config.backend == "http":
        optional("httpx", extra="llm", feature="the enrich step's http backend")
        from recsys.enrich.http import HttpBackend, HttpSettings

        assert config.url is not None  # checked by EnrichConfig
        return HttpBackend(HttpSettings(
            url=config.url, model=config.model, api_key_env=config.api_key_env, concurrency=config.concurrency,
            requests_per_s=config.requests_per_s, timeout_s=config.timeout_s, max_retries=config.max_retries,
            token_budget=config.token_budget, max_failures_in_a_row=config.max_failures_in_a_row,
        ))  # fmt: skip
    optional("transformers", extra="llm", feature="the enrich step's local model")
    from recsys.enrich.local import LocalBackend

    return LocalBackend(config.model, cache_dir=cache_dir, device=config.device, precision=config.precision,
                        threads=config.threads)  # fmt: skip
