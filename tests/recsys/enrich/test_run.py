"""The catalogue run's speed is that of answering: a backend's model load is timed apart, and not at all when
everything is in the cache."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from recsys.enrich.backend import Generated
from recsys.enrich.cache import EnrichCache
from recsys.enrich.record import Prompt, load_prompt
from recsys.enrich.run import enrich_catalogue

RECORD = {"category": "Beauty > Skin Care", "brand": "Acme", "keywords": ["acme", "lip", "balm"],
          "description": "A lip balm.", "queries": ["acme lip", "balm"]}  # fmt: skip


class SlowToLoad:
    """A backend whose model takes `load_s` to load and answers at once."""

    name, model, constrained, unavailable = "slow", "slow@0", True, None

    def __init__(self, load_s: float) -> None:
        self.load_s, self.loads = load_s, 0

    def load(self) -> None:
        time.sleep(self.load_s)
        self.loads += 1

    def generate(self, texts: Sequence[str], prompt: Prompt, problems: object = None) -> list[Generated]:
        return [Generated(json.dumps(RECORD)) for _ in texts]


def test_the_rate_leaves_the_model_load_out(tmp_path: Path) -> None:
    backend, cache = SlowToLoad(load_s=0.5), EnrichCache(tmp_path)
    titles = [f"Acme Lip Balm {n}" for n in range(4)]
    summary = enrich_catalogue(titles, titles, backend, load_prompt(), cache, tmp_path / "m.parquet")
    assert summary.ok == 4 and summary.load_seconds >= 0.5 and summary.seconds < 0.25
    assert summary.record()["items_per_second"] > 16  # 4 items in under 0.25 s, the 0.5 s load apart
    again = enrich_catalogue(titles, titles, backend, load_prompt(), cache, tmp_path / "m.parquet")
    assert (again.asked, again.load_seconds, backend.loads) == (0, 0.0, 1)  # all cached: nothing loaded
