"""What every enrichment backend gives back, and the protocol it follows (`local`, `http`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from recsys.enrich.record import Prompt
from recsys.errors import RecsysError

DEFAULT_LOCAL_MODEL = "gemma3-270m"  # the packaged Gemma 3 270M (recsys.enrich.local)
BUDGET_SPENT = "token budget spent"  # a Generated's error when the item was never asked: left for the next run


@dataclass(frozen=True)
class Generated:
    """One item's answer: its text, or None and why there is none (`error`); the values cut at their cap.

    `transient`: there is no answer for a reason that is not the item's (an outage, a server that answered something
    other than a chat completion, a spent token budget): nothing is cached, the next run asks again. Otherwise a
    missing or refused answer is the model's, and is cached as failed.
    """

    text: str | None
    truncated: tuple[str, ...] = ()
    error: str | None = None
    tokens: int = 0  # prompt + answer tokens, where the backend counts them (a token budget's unit)
    transient: bool = False


class Backend(Protocol):
    """Writes one record per item text; `model` names the model in cache keys."""

    name: str
    model: str
    constrained: bool  # answers follow the record's schema by construction (never re-asked)
    # why the backend cannot answer any more (a server down: its requests failed many times in a row), or None; the
    # run stops there, keeping every answer it got
    unavailable: str | None

    def load(self) -> None:
        """Make ready what answering needs (a local model), so a run times its answers apart from the load; a run
        with nothing to ask never calls it."""
        ...

    def generate(
        self, texts: Sequence[str], prompt: Prompt, problems: Sequence[str | None] | None = None
    ) -> list[Generated]:
        """One answer per text. `problems`: why each text's previous answer was refused (a re-ask), or None."""
        ...


class BackendUnavailable(RecsysError):
    """A run stopped because its backend cannot answer any more (`Backend.unavailable`); what it got is cached."""
