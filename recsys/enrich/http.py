"""The HTTP backend: any OpenAI-compatible chat-completions endpoint (vLLM, a llama.cpp server, a hosted model).

Each item is one request (`Prompt.messages`: the few-shot examples as chat turns), `temperature` 0, with the
record's JSON schema as `response_format` (constrained decoding where the server supports it; a server that refuses
the field is asked without it from then on, and its answers are checked and repaired like any text). Requests run
`concurrency` at a time, at most `requests_per_s`; a 429, a 5xx, a timeout or a dropped connection is retried up to
`max_retries` times with exponential back-off (a `Retry-After` is honoured); any other 4xx fails the item at once.
`token_budget` caps the prompt + answer tokens the run may spend (as the server counts them in `usage`): once spent,
the remaining items get no request (they are left for the next run, not failed). The key is read from the
environment variable `api_key_env`, never from a file or the command line.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from recsys.enrich.backend import BUDGET_SPENT, Generated
from recsys.enrich.record import Prompt
from recsys.errors import ConfigError

logger = logging.getLogger(__name__)

RETRIED = {429, 500, 502, 503, 504}


@dataclass(frozen=True)
class HttpSettings:
    url: str  # the server's base URL, e.g. http://127.0.0.1:8080/v1
    model: str  # the model name the server expects
    api_key_env: str | None = "OPENAI_API_KEY"  # None or unset: no Authorization header
    concurrency: int = 4
    requests_per_s: float | None = None
    timeout_s: float = 60.0
    max_retries: int = 4
    backoff_s: float = 1.0  # the first retry's wait; doubled each time
    max_tokens: int = 256  # of one answer
    token_budget: int | None = None  # of the whole run

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"enrich url {self.url!r} is not an http(s) URL. Fix: e.g. http://127.0.0.1:8080/v1")
        if self.concurrency < 1 or self.max_retries < 0 or self.timeout_s <= 0:
            raise ConfigError("enrich concurrency must be >= 1, max_retries >= 0 and timeout_s > 0. Fix: correct them")


class HttpBackend:
    """Chat completions from an OpenAI-compatible server (module docstring)."""

    name = "http"
    constrained = False

    def __init__(self, settings: HttpSettings) -> None:
        self.settings = settings
        self.model = f"{settings.model}@{settings.url}"
        key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(base_url=settings.url.rstrip("/"), headers=headers, timeout=settings.timeout_s)
        self._lock = threading.Lock()
        self._schema_accepted = True
        self._next_request_at = 0.0
        self.tokens_spent = 0

    def close(self) -> None:
        self._client.close()

    def generate(
        self, texts: Sequence[str], prompt: Prompt, problems: Sequence[str | None] | None = None
    ) -> list[Generated]:
        problems = problems or [None] * len(texts)
        with ThreadPoolExecutor(self.settings.concurrency) as pool:
            return list(pool.map(lambda args: self._one(prompt, *args), zip(texts, problems, strict=True)))

    def _one(self, prompt: Prompt, text: str, problem: str | None) -> Generated:
        messages = prompt.messages(text)
        if problem is not None:  # the re-ask: say what was wrong
            messages.append({"role": "user", "content": f"That answer was not valid ({problem}). Answer again with "
                             "the JSON object only, every field filled."})  # fmt: skip
        error = "no attempt made"
        for attempt in range(self.settings.max_retries + 1):
            if self._budget_spent():
                return Generated(None, error=BUDGET_SPENT)
            self._pace()
            try:
                response = self._client.post("/chat/completions", json=self._body(prompt, messages))
            except (httpx.TimeoutException, httpx.TransportError) as err:
                error, wait = f"{type(err).__name__}: {err}", None
            else:
                if response.status_code == 400 and self._schema_accepted and "response_format" in response.text:
                    logger.warning("enrich: %s refuses response_format; asking without it (answers are checked)",
                                   self.settings.url)  # fmt: skip
                    self._schema_accepted = False
                    continue
                if response.is_success:
                    return self._answer(response.json())
                error, wait = f"HTTP {response.status_code}: {response.text[:200]}", _retry_after(response)
                if response.status_code not in RETRIED:
                    return Generated(None, error=error)
            if attempt < self.settings.max_retries:
                time.sleep(wait if wait is not None else self.settings.backoff_s * 2**attempt)
        return Generated(None, error=f"gave up after {self.settings.max_retries + 1} attempts: {error}")

    def _body(self, prompt: Prompt, messages: list[dict[str, str]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.settings.model, "messages": messages, "temperature": 0,
                                "max_tokens": self.settings.max_tokens}  # fmt: skip
        if self._schema_accepted:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "item_metadata", "schema": prompt.json_schema(), "strict": True}}  # fmt: skip
        return body

    def _answer(self, payload: dict[str, Any]) -> Generated:
        tokens = int((payload.get("usage") or {}).get("total_tokens") or 0)
        with self._lock:
            self.tokens_spent += tokens
        try:
            choice = payload["choices"][0]
            text = choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            return Generated(None, error=f"no choices[0].message.content in the answer: {json.dumps(payload)[:200]}")
        cut = ("answer",) if choice.get("finish_reason") == "length" else ()
        return Generated(text if isinstance(text, str) else None, truncated=cut, tokens=tokens,
                         error=None if isinstance(text, str) else "the answer's content is not text")  # fmt: skip

    def _budget_spent(self) -> bool:
        budget = self.settings.token_budget
        with self._lock:
            return budget is not None and self.tokens_spent >= budget

    def _pace(self) -> None:
        """Wait for this request's turn under `requests_per_s`."""
        if not self.settings.requests_per_s:
            return
        with self._lock:
            at = max(self._next_request_at, time.monotonic())
            self._next_request_at = at + 1.0 / self.settings.requests_per_s
        time.sleep(max(0.0, at - time.monotonic()))


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return min(float(value), 300.0)
    except ValueError:
        return None
