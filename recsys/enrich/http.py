"""The HTTP backend: any OpenAI-compatible chat-completions endpoint (vLLM, a llama.cpp server, a hosted model).

Each item is one request (`Prompt.messages`: the few-shot examples as chat turns), `temperature` 0, with the
record's JSON schema as `response_format` (constrained decoding where the server supports it; a server that refuses
the field is asked without it from then on, and its answers are checked and repaired like any text). Requests run
`concurrency` at a time, at most `requests_per_s`.

Every request is bounded in total time: `timeout_s` from connecting to the answer's last byte (a server that trickles
its answer a byte at a time is cut off there, not after each read), and its answer at `MAX_ANSWER_BYTES`. Every answer
is validated before it is used: a 2xx whose body is not a chat completion (not JSON, a list, a `usage` that is not a
count of tokens) is the server's failure, not the model's. The failures are told apart:
- transient (the server's or the network's: a timeout, a refused or dropped connection, a 429, a 5xx, an answer that is
  not a chat completion): retried up to `max_retries` times with exponential back-off (a valid `Retry-After` is
  honoured, capped at `max_wait_s`); an item still without an answer is not cached (the next run asks again). Other
  non-2xx answers (401, 403, 404: a wrong key, URL or model) are transient too, without retries;
- permanent (the item's): a 400, 413 or 422 to its request, and an answer whose text is not a record (checked by
  the run), cached as failed.
After `max_failures_in_a_row` failed requests with none answered in between, the server counts as down
(`unavailable`): nothing more is sent and the run stops with what it got.

`token_budget` caps the prompt + answer tokens the run may spend (as the server counts them in `usage`): once spent,
the remaining items get no request (they are left for the next run, not failed). The key is read from the
environment variable `api_key_env`, never from a file or the command line.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from recsys.enrich.backend import BUDGET_SPENT, Generated
from recsys.enrich.record import Prompt
from recsys.errors import ConfigError

logger = logging.getLogger(__name__)

ITEM_REFUSED = {400, 413, 422}  # the item's own request is refused: a permanent failure of that item
MAX_ANSWER_BYTES = 1 << 20  # an answer is a few hundred tokens; a larger body is not one


@dataclass(frozen=True)
class HttpSettings:
    url: str  # the server's base URL, e.g. http://127.0.0.1:8080/v1
    model: str  # the model name the server expects
    api_key_env: str | None = "OPENAI_API_KEY"  # None or unset: no Authorization header
    concurrency: int = 4
    requests_per_s: float | None = None
    timeout_s: float = 60.0  # of one request, in total (connect, send, every byte of the answer)
    max_retries: int = 4
    backoff_s: float = 1.0  # the first retry's wait; doubled each time
    max_wait_s: float = 60.0  # the longest wait before a retry, whatever a Retry-After asks
    max_tokens: int = 256  # of one answer
    token_budget: int | None = None  # of the whole run
    max_failures_in_a_row: int = 8  # failed requests, none answered in between, that mean the server is down

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"enrich url {self.url!r} is not an http(s) URL. Fix: e.g. http://127.0.0.1:8080/v1")
        if self.concurrency < 1 or self.max_retries < 0 or not 0 < self.timeout_s < math.inf:
            raise ConfigError(
                f"enrich concurrency must be >= 1, max_retries >= 0 and timeout_s > 0 (given {self.concurrency}, "
                f"{self.max_retries}, {self.timeout_s}). Fix: correct them"
            )
        if self.max_failures_in_a_row < 1:
            raise ConfigError("enrich max_failures_in_a_row must be >= 1. Fix: correct it (default 8)")


@dataclass(frozen=True)
class _Failure:
    """A request that got no usable answer: why, whether to try again, and how long the server asked to wait."""

    error: str
    retry: bool
    wait_s: float | None = None


class HttpBackend:
    """Chat completions from an OpenAI-compatible server (module docstring)."""

    name = "http"
    constrained = False

    def __init__(self, settings: HttpSettings) -> None:
        self.settings = settings
        self.model = f"{settings.model}@{settings.url}"
        key = os.environ.get(settings.api_key_env) if settings.api_key_env else None
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._schema_accepted = True
        self._next_request_at = 0.0
        self._failures_in_a_row = 0
        self._down = asyncio.Event()  # set with `unavailable` (made again for each batch's event loop)
        self.tokens_spent = 0
        self.unavailable: str | None = None

    def load(self) -> None:
        """Nothing to load: the server holds the model."""

    def generate(
        self, texts: Sequence[str], prompt: Prompt, problems: Sequence[str | None] | None = None
    ) -> list[Generated]:
        return asyncio.run(self._generate(texts, prompt, problems or [None] * len(texts)))

    async def _generate(self, texts: Sequence[str], prompt: Prompt, problems: Sequence[str | None]) -> list[Generated]:
        slots = asyncio.Semaphore(self.settings.concurrency)
        self._down = asyncio.Event()  # ends the retries' waits once the server is found down
        async with httpx.AsyncClient(
            base_url=self.settings.url.rstrip("/"), headers=self._headers, timeout=self.settings.timeout_s
        ) as client:

            async def one(text: str, problem: str | None) -> Generated:
                async with slots:
                    return await self._one(client, prompt, text, problem)

            return list(await asyncio.gather(*(one(t, p) for t, p in zip(texts, problems, strict=True))))

    async def _one(self, client: httpx.AsyncClient, prompt: Prompt, text: str, problem: str | None) -> Generated:
        messages = prompt.messages(text)
        if problem is not None:  # the re-ask: say what was wrong
            messages.append({"role": "user", "content": f"That answer was not valid ({problem}). Answer again with "
                             "the JSON object only, every field filled."})  # fmt: skip
        attempts = 0
        while True:
            if self.unavailable is not None:
                return Generated(None, error=f"not sent: {self.unavailable}", transient=True)
            if self._budget_spent():
                return Generated(None, error=BUDGET_SPENT, transient=True)
            await self._pace()
            result = await self._attempt(client, prompt, messages)
            attempts += 1
            if isinstance(result, Generated):
                self._failures_in_a_row = 0  # the server answers
                return result
            self._count_failure(result)
            if not result.retry or attempts > self.settings.max_retries:
                return Generated(None, error=f"no answer (attempts: {attempts}): {result.error}", transient=True)
            wait = result.wait_s if result.wait_s is not None else self.settings.backoff_s * 2 ** (attempts - 1)
            with contextlib.suppress(TimeoutError):  # the wait, cut short if the server is found down meanwhile
                await asyncio.wait_for(self._down.wait(), min(wait, self.settings.max_wait_s))

    async def _attempt(
        self, client: httpx.AsyncClient, prompt: Prompt, messages: list[dict[str, str]]
    ) -> Generated | _Failure:
        """One request, bounded in total time and size: the item's answer (a permanent failure when its request is
        refused), or why there is none."""
        sent = self._body(prompt, messages)
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                async with client.stream("POST", "/chat/completions", json=sent) as response:
                    body = await _read_capped(response)
        except TimeoutError:
            return _Failure(f"no whole answer within timeout_s={self.settings.timeout_s:g} s", retry=True)
        except httpx.HTTPError as err:
            return _Failure(f"{type(err).__name__}: {err}", retry=True)
        except _TooLarge:
            return _Failure(f"an answer over {MAX_ANSWER_BYTES:,} bytes: not a chat completion", retry=True)
        status = response.status_code
        if status == 400 and "response_format" in sent and b"response_format" in body:
            if self._schema_accepted:  # the requests in flight beside this one are refused too: said once
                logger.warning("enrich: %s refuses response_format; asking without it (answers are checked)",
                               self.settings.url)  # fmt: skip
                self._schema_accepted = False
            return await self._attempt(client, prompt, messages)
        if response.is_success:
            return self._answer(body)
        error = f"HTTP {status}: {_snippet(body)}"
        if status in ITEM_REFUSED:
            return Generated(None, error=error)
        retried = status in (408, 429) or status >= 500
        return _Failure(error, retry=retried, wait_s=_retry_after(response.headers.get("retry-after")))

    def _body(self, prompt: Prompt, messages: list[dict[str, str]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.settings.model, "messages": messages, "temperature": 0,
                                "max_tokens": self.settings.max_tokens}  # fmt: skip
        if self._schema_accepted:
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "item_metadata", "schema": prompt.json_schema(), "strict": True}}  # fmt: skip
        return body

    def _answer(self, body: bytes) -> Generated | _Failure:
        """The item's answer in a 2xx body, or a failure when the body is not a chat completion."""
        try:
            completion = _Completion.model_validate(json.loads(body), strict=True)
        except (ValueError, RecursionError) as err:  # not JSON, not UTF-8, nested past the parser; ValidationError
            why = _envelope_problems(err) if isinstance(err, ValidationError) else "not JSON"
            return _Failure(f"the answer is not a chat completion ({why}): {_snippet(body)}", retry=True)
        tokens = completion.usage.total_tokens if completion.usage else 0
        self.tokens_spent += tokens
        choice = completion.choices[0]
        cut = ("answer",) if choice.finish_reason == "length" else ()
        text = choice.message.content
        error = None if text is not None else "no text in the answer"
        return Generated(text, truncated=cut, tokens=tokens, error=error)

    def _count_failure(self, failure: _Failure) -> None:
        self._failures_in_a_row += 1
        if self._failures_in_a_row >= self.settings.max_failures_in_a_row and self.unavailable is None:
            self.unavailable = (f"{self.settings.url} failed {self._failures_in_a_row} requests in a row "
                                f"(the last: {failure.error})")  # fmt: skip
            logger.warning("enrich: %s; sending nothing more", self.unavailable)
            self._down.set()

    def _budget_spent(self) -> bool:
        budget = self.settings.token_budget
        return budget is not None and self.tokens_spent >= budget

    async def _pace(self) -> None:
        """Wait for this request's turn under `requests_per_s` (the requests share one event loop: no lock)."""
        if not self.settings.requests_per_s:
            return
        at = max(self._next_request_at, time.monotonic())
        self._next_request_at = at + 1.0 / self.settings.requests_per_s
        await asyncio.sleep(max(0.0, at - time.monotonic()))


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class _Usage(_Strict):
    total_tokens: int = Field(default=0, ge=0)


class _Message(_Strict):
    content: str | None = None


class _Choice(_Strict):
    message: _Message
    finish_reason: str | None = None


class _Completion(_Strict):
    """The part of an OpenAI chat completion this backend reads."""

    choices: list[_Choice] = Field(min_length=1)
    usage: _Usage | None = None


class _TooLarge(Exception):
    """An answer past `MAX_ANSWER_BYTES`."""


async def _read_capped(response: httpx.Response) -> bytes:
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _retry_after(value: str | None) -> float | None:
    """The seconds a `Retry-After` asks to wait (a number, or an HTTP date), or None when it says nothing usable
    (absent, negative, not a number: the back-off applies). Capped by the caller."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return seconds if 0 <= seconds < math.inf else None  # NaN fails both comparisons


def _envelope_problems(err: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the body'}: {e['msg']}" for e in err.errors()[:3])


def _snippet(body: bytes) -> str:
    return " ".join(body[:200].decode(errors="replace").split())
