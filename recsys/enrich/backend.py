"""What every enrichment backend gives back, and the protocol it follows (`local`, `http`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from recsys.enrich.record import Prompt

DEFAULT_LOCAL_MODEL = "gemma3-270m"  # the packaged Gemma 3 270M (recsys.enrich.local)
BUDGET_SPENT = "token budget spent"  # a Generated's error when the item was never asked: left for the next run


@dataclass(frozen=True)
class Generated:
    """One item's answer: its text, or None and why there is none (`error`); the values cut at their cap."""

    text: str | None
    truncated: tuple[str, ...] = ()
    error: str | None = None
    tokens: int = 0  # prompt + answer tokens, where the backend counts them (a token budget's unit)


class Backend(Protocol):
    """Writes one record per item text; `model` names the model in cache keys."""

    name: str
    model: str
    constrained: bool  # answers follow the record's schema by construction (never re-asked)

    def generate(
        self, texts: Sequence[str], prompt: Prompt, problems: Sequence[str | None] | None = None
    ) -> list[Generated]:
        """One answer per text. `problems`: why each text's previous answer was refused (a re-ask), or None."""
        ...
