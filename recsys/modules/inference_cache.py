"""Tensors a model derives from its weights once per state, not once per call: a projected item table, a content
nearest-neighbour table. Kept while no gradient is being recorded (inference, validation) and until a tensor they
read changes: an optimizer step or a state-dict load bumps its version (`Tensor._version`), a move to another
device gives it another storage, and either recomputes the value at its next use.

Example:
    >>> import torch
    >>> weight = torch.ones(3, 2)
    >>> cache = InferenceCache()
    >>> with torch.no_grad():
    ...     first = cache.get("sum", lambda: weight.sum(dim=1), reads=[weight])
    ...     assert cache.get("sum", lambda: weight.sum(dim=1), reads=[weight]) is first  # kept
    ...     _ = weight.mul_(2)  # in place: its version moves on
    ...     cache.get("sum", lambda: weight.sum(dim=1), reads=[weight]).tolist()
    [4.0, 4.0, 4.0]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

import torch

T = TypeVar("T")


class InferenceCache:
    """Named values, each kept with the identity and version of the tensors it was computed from."""

    def __init__(self) -> None:
        self._kept: dict[str, tuple[tuple[object, ...], object]] = {}

    @staticmethod
    def applies() -> bool:
        """Whether a value may be kept now: no gradient is recorded (a kept tensor would carry a stale graph) and no
        graph is being compiled (which must see the computation)."""
        return not torch.is_grad_enabled() and not torch.compiler.is_compiling()

    def get(self, name: str, compute: Callable[[], T], reads: Iterable[torch.Tensor]) -> T:
        """The value `compute()` gave for the current state of `reads`, computed again when one of them changed (or
        every call, where no value may be kept: `applies`)."""
        if not self.applies():
            return compute()
        key = (torch.is_autocast_enabled(), *((tensor.data_ptr(), tensor._version) for tensor in reads))
        kept = self._kept.get(name)
        if kept is None or kept[0] != key:
            kept = self._kept[name] = (key, compute())
        return kept[1]  # type: ignore[return-value]  # stored by this name's compute, of type T
