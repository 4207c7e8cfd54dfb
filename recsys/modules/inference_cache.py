"""Tensors a model derives from its weights once per state, not once per call: a projected item table, a content
nearest-neighbour table. Kept while no gradient is being recorded (inference, validation) and until the weights may
have changed: the cache is a submodule of the model that owns it, so a switch of mode (`train()`, `eval()`) or a
state-dict load drops every value, and a tensor it read that was written in place (its `Tensor._version`) or moved
to another device (its storage) recomputes the value at its next use. The mode switch is what makes this safe in
training: a fused optimizer's step (`torch.optim.Adam(fused=True)`, the CUDA default here) writes the weights
without moving their version.

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
from typing import Any, TypeVar

import torch
from torch import nn

T = TypeVar("T")


class InferenceCache(nn.Module):
    """Named values, each kept with the identity and version of the tensors it was computed from; assign it as an
    attribute of the module whose weights it reads, so that the module's mode switches and loads reach it.

    Args:
        reads_weights: False for values of fixed buffers alone (a content-neighbour table), which no optimizer
            writes: kept across mode switches, not rebuilt twice an epoch.
    """

    def __init__(self, reads_weights: bool = True) -> None:
        super().__init__()
        self.reads_weights = reads_weights
        self._kept: dict[str, tuple[tuple[object, ...], object]] = {}

    def train(self, mode: bool = True) -> InferenceCache:
        if self.reads_weights:
            self._kept.clear()
        return super().train(mode)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._kept.clear()
        super()._load_from_state_dict(*args, **kwargs)

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
