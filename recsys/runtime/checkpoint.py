"""Checkpoint files, written atomically (a crash never leaves a truncated file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from recsys.runtime.atomic import atomic_file


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """torch.save `payload` (tensors and plain Python values) to `path` atomically."""
    with atomic_file(path) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint written by `save_checkpoint` on the CPU."""
    payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return payload
