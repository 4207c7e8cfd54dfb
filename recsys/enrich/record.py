"""The item-metadata record an LLM writes, the versioned prompt that asks for it, and how an answer is checked.

A record is `ItemMetadata`: a category from the prompt's list, the brand, 3-6 keywords, a one-sentence description
and 2-3 shopper queries. `check_answer` turns an answer's text into a record or says why it cannot be one; a text
that is not JSON gets one repair (`repaired`: code fences, prose around the object, trailing commas) before it
counts as malformed. Values are stripped and list entries de-duplicated (case-insensitively) before the counts are
checked, so a list that repeats one keyword six times is not a valid record.

The prompt lives in `recsys/enrich/prompts/<version>.yaml`: a header, the category list, few-shot examples and how a
local model chooses the category (`category_choice`: `tokens`, the best allowed token at each step, or `whole`, the
most likely option as a whole: `recsys.enrich.guided.Choice`). Its version is part of every cache key
(`recsys.enrich.cache`), so answers chosen one way are never read back as the other's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from recsys.enrich.guided import Choice, Free, FreeList, Literal, Skeleton
from recsys.errors import ConfigError
from recsys.runtime.validation import problems
from recsys.runtime.yaml_files import read_yaml

PROMPTS_DIR = Path(__file__).with_name("prompts")
DEFAULT_PROMPT = "item-metadata-v2"
CATEGORY_CHOICES = ("tokens", "whole")
MAX_TEXT_CHARS = 1_000  # of an item's text in a prompt: a long description says nothing more a 270M model reads

KEYWORDS = (3, 6)
QUERIES = (2, 3)


class ItemMetadata(BaseModel):
    """One item's metadata, as the LLM wrote it (after stripping and de-duplication)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    category: str = Field(min_length=1, max_length=80)
    brand: str = Field(max_length=60)
    keywords: tuple[str, ...] = Field(min_length=KEYWORDS[0], max_length=KEYWORDS[1])
    description: str = Field(min_length=1, max_length=400)
    queries: tuple[str, ...] = Field(min_length=QUERIES[0], max_length=QUERIES[1])


FIELDS = tuple(ItemMetadata.model_fields)


@dataclass(frozen=True)
class Prompt:
    """A versioned few-shot prompt (module docstring)."""

    version: str
    header: str
    categories: tuple[str, ...]
    examples: tuple[tuple[str, ItemMetadata], ...]
    category_choice: str = "tokens"

    def prefix(self) -> str:
        """What every item's prompt starts with (the header and the examples): its KV cache is computed once."""
        shots = "".join(f"Item: {example}\nMetadata: {_json(record)}\n\n" for example, record in self.examples)
        return f"{self.header}\n\n{shots}Item:"

    def suffix(self, text: str) -> str:
        """The rest of one item's prompt, ending where its record starts (a base model continues it)."""
        return f" {_clip(text)}\nMetadata:"

    def messages(self, text: str) -> list[dict[str, str]]:
        """The same prompt as chat messages, for an instruction-tuned model behind an HTTP endpoint."""
        system = (f"{self.header} Answer with the JSON object only. The category is one of: "
                  f"{'; '.join(self.categories)}.")  # fmt: skip
        turns: list[dict[str, str]] = [{"role": "system", "content": system}]
        for example, record in self.examples:
            turns += [{"role": "user", "content": f"Item: {example}"}, {"role": "assistant", "content": _json(record)}]
        return [*turns, {"role": "user", "content": f"Item: {_clip(text)}"}]

    def skeleton(self, max_tokens: dict[str, int]) -> Skeleton:
        """The record as a guided-decoding skeleton (`recsys.enrich.guided`): keywords grounded in the item text."""
        return Skeleton((
            Literal(' {"category": "'), Choice(self.categories, whole=self.category_choice == "whole"),  # the space:
            Literal(', "brand": "'), Free("brand", max_tokens["brand"]),  # as the examples tokenise it
            Literal(', "keywords": ["'), FreeList(Free("keywords", max_tokens["keywords"], grounded=True), *KEYWORDS),
            Literal(', "description": "'), Free("description", max_tokens["description"], sentence=True),
            Literal(', "queries": ["'), FreeList(Free("queries", max_tokens["queries"]), *QUERIES),
            Literal("}"),
        ))  # fmt: skip

    def json_schema(self) -> dict[str, Any]:
        """The record's JSON schema with the category list as an enum (for backends that constrain to a schema)."""
        schema = ItemMetadata.model_json_schema()
        schema["properties"]["category"]["enum"] = list(self.categories)
        return schema


def load_prompt(version: str = DEFAULT_PROMPT, categories: tuple[str, ...] | None = None) -> Prompt:
    """The prompt `version` (a file of `PROMPTS_DIR`), with `categories` in place of its list when given."""
    raw = _prompt_file(version)
    examples = tuple((str(e["text"]), ItemMetadata.model_validate(_tuples(e["metadata"]))) for e in raw["examples"])
    choice = raw.get("category_choice", "tokens")
    if choice not in CATEGORY_CHOICES:
        raise ConfigError(f"prompt {version}: category_choice {choice!r} is unknown. Fix: one of {CATEGORY_CHOICES}")
    prompt = Prompt(raw["version"], raw["header"].strip(), tuple(categories or raw["categories"]), examples, choice)
    if not prompt.categories or len(set(prompt.categories)) != len(prompt.categories):
        raise ConfigError(f"the category list of prompt {version} is empty or repeats a name. Fix: list each once")
    return prompt


def prompt_versions() -> list[str]:
    """The prompt versions shipped with the package: the names of `PROMPTS_DIR`'s YAML files."""
    return sorted(p.stem for p in PROMPTS_DIR.glob("*.yaml"))


def check_prompt_version(version: str) -> str:
    """`version` when it is a prompt version shipped with the package; ConfigError listing them otherwise (a version
    is a name, never a path: `../../x` would read a file outside the package).

    Example:
        >>> check_prompt_version("../../etc/passwd")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        recsys.errors.ConfigError: enrich.prompt: no prompt '../../etc/passwd' (a version shipped in ...
    """
    known = prompt_versions()
    if version not in known:
        shown = repr(version) if len(version) <= 60 else f"{version[:40]!r}... ({len(version):,} characters)"
        raise ConfigError(f"enrich.prompt: no prompt {shown} (a version shipped in recsys/enrich/prompts/, not a "
                          f"path). Fix: use one of {', '.join(known)}")  # fmt: skip
    return version


@cache
def _prompt_file(version: str) -> dict[str, Any]:
    path = PROMPTS_DIR / f"{check_prompt_version(version)}.yaml"
    raw = read_yaml(path)
    if raw.get("version") != version:
        raise ConfigError(f"{path}: its version is {raw.get('version')!r}, not its file name. Fix: make them agree")
    return raw


class AnswerError(ValueError):
    """Why an answer is not a valid record (said in the record's `problem`)."""


def check_answer(text: str, categories: tuple[str, ...]) -> ItemMetadata:
    """The record an answer's text holds; AnswerError when it holds none, even after one repair."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        try:
            raw = json.loads(repaired(text))
        except json.JSONDecodeError as err:
            raise AnswerError(f"not JSON, even repaired ({err.msg} at character {err.pos})") from err
    if not isinstance(raw, dict):
        raise AnswerError(f"a JSON {type(raw).__name__}, not an object")
    try:
        record = ItemMetadata.model_validate(_tuples(_cleaned(raw)))
    except ValidationError as err:
        raise AnswerError(problems(err)) from err
    if record.category not in categories:
        raise AnswerError(f"category {record.category[:80]!r} is not in the prompt's list")
    return record


def record_problem(text: object, categories: tuple[str, ...] | None = None) -> str | None:
    """Why `text` (a record as JSON, as the cache keeps it) is not a valid record, or None; with `categories`, its
    category must be one of them."""
    if not isinstance(text, str):
        return f"the record is a {type(text).__name__}, not JSON text"
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        return "the record is not JSON"
    if not isinstance(raw, dict):
        return f"the record is a JSON {type(raw).__name__}, not an object"
    try:
        record = ItemMetadata.model_validate(_tuples(raw))
    except ValidationError as err:
        return problems(err)
    if categories is not None and record.category not in categories:
        return f"category {record.category!r} is not in the prompt's list"
    return None


def repaired(text: str) -> str:
    """`text` with the usual damage undone: a code fence, prose around the object, trailing commas."""
    text = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())
    start, end = text.find("{"), text.rfind("}")
    if start != -1 and end > start:
        text = text[start : end + 1]
    return re.sub(r",\s*([}\]])", r"\1", text)


def _cleaned(raw: dict[str, Any]) -> dict[str, Any]:
    out = dict(raw)
    for key, value in raw.items():
        if isinstance(value, str):
            out[key] = value.strip()
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            seen: dict[str, str] = {}
            for entry in (v.strip() for v in value):
                if entry and entry.lower() not in seen:
                    seen[entry.lower()] = entry
            out[key] = list(seen.values())
    return out


def _tuples(raw: dict[str, Any]) -> dict[str, Any]:
    return {key: tuple(value) if isinstance(value, list) else value for key, value in raw.items()}


def _json(record: ItemMetadata) -> str:
    return json.dumps(record.model_dump(mode="json"), ensure_ascii=False)


def _clip(text: str) -> str:
    return " ".join(text.split())[:MAX_TEXT_CHARS]
