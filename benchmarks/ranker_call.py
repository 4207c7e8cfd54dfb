"""What a multi-source ranker's model call costs on this machine's CPU, against its first stage's, at the micro-batch
sizes a server hands it, and how that cost moves with the number of candidates each source proposes.

Usage:
    .venv/bin/python -m benchmarks.ranker_call      # benchmarks/configs/ranker-call.yaml

The models are trained model directories (`recsys train`'s: their `model.pt`); serving cost depends on a model's
shape, not its weights, so a one-epoch model serves for this. Each `widths` entry sets every source's top-N (one
number per source, in the ranker's source order; null: as trained) on the same weights: the per-candidate work (the
target attention, the head, the content cosines) runs once per candidate of the union. Histories are `history` items
drawn uniformly from the catalogue (seeded), left-padded to the models' window; each call is timed `repeats` times
after one warm-up, medians reported, with each source's share (`last_source_calls`) and the ranking's.

Settings: benchmarks/configs/ranker-call.yaml (`--config`, `--set KEY=VALUE`). Writes
benchmarks/results/<result_name>.json.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    benchmark_parser,
    median_seconds,
    parse_run,
    provenance,
    settings_from,
    significant,
    write_result,
)
from recsys.errors import ConfigError
from recsys.models.family import Model
from recsys.models.ranker import TwoStageRanker
from recsys.models.registry import load_model


@dataclass(frozen=True)
class Settings:
    model_dir: str  # the multi-source ranker's trained model directory
    baseline_model_dir: str  # its first stage's (the model it is compared with when served)
    widths: tuple[tuple[int, ...] | None, ...] = (None,)  # each: every source's top-N; None: as trained
    batch_sizes: tuple[int, ...] = (1, 4, 16)
    history: int = 30  # real items per history (the rest of the window padding)
    repeats: int = 50
    threads: int = 2  # torch CPU threads, as a 2-core server
    seed: int = 0
    result_name: str = "ranker-call"


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/ranker-call.yaml")
    args, reproduce, s = parse_run(parser, argv, __name__, load_settings)
    torch.set_num_threads(s.threads)
    ranker, baseline = _ranker(Path(s.model_dir)), load_model(Path(s.baseline_model_dir) / "model.pt")[1]
    trained = ranker.config.sources
    rows = []
    for width in s.widths:
        if width is not None and len(width) != len(trained):
            raise ConfigError(f"widths entry {list(width)} has {len(width)} tops for {len(trained)} sources "
                              f"({[source.name for source in trained]}). Fix: one top-N per source")  # fmt: skip
        tops = width or tuple(source.top for source in trained)
        sources = tuple(dataclasses.replace(source, top=top) for source, top in zip(trained, tops, strict=True))
        ranker.config = dataclasses.replace(ranker.config, sources=sources)
        for batch in s.batch_sizes:
            rows.append({"tops": list(tops), "batch": batch, **_costs(ranker, baseline, _histories(s, ranker, batch),
                                                                     s.repeats)})  # fmt: skip
    ranker.config = dataclasses.replace(ranker.config, sources=trained)
    result = {"settings": asdict(s), "sources": [source.name for source in trained],
              "torch_threads": torch.get_num_threads(), "rows": rows, **provenance()}  # fmt: skip
    path = write_result(s.result_name, result, args.results_dir, reproduce)
    for row in rows:
        print(f"tops {row['tops']} batch {row['batch']:>3}: {row['candidates']:>5.0f} candidates, ranker "
              f"{row['ranker_ms']:.2f} ms, first stage {row['baseline_ms']:.2f} ms ({row['ratio']:.1f}x)")  # fmt: skip
    print(f"-> {path}")
    return path


def _ranker(model_dir: Path) -> TwoStageRanker:
    _, model = load_model(model_dir / "model.pt")
    if not isinstance(model, TwoStageRanker) or not model.config.sources:
        raise ConfigError(
            f"{model_dir} does not hold a ranker over candidate sources (its model is {type(model).__name__}). "
            "Fix: model_dir names a ranker trained with model.params.sources"
        )
    return model


def _histories(s: Settings, ranker: TwoStageRanker, batch: int) -> torch.Tensor:
    """(batch, window) left-padded histories of `s.history` uniformly drawn items."""
    generator = torch.Generator().manual_seed(s.seed)
    items = torch.randint(1, ranker.config.num_items + 1, (batch, s.history), generator=generator)
    return torch.nn.functional.pad(items, (max(0, ranker.max_history - s.history), 0))


@torch.no_grad()
def _costs(ranker: TwoStageRanker, baseline: Model[Any], histories: torch.Tensor, repeats: int) -> dict[str, Any]:
    """Median ms of the ranker's and the first stage's call, the union's width, each source's and the ranking's."""
    found = ranker.candidates(histories)
    rank = median_seconds(lambda: ranker.rank_candidates(histories, found.items, found.retrieval, found.features),
                          repeats)  # fmt: skip
    ranker.score(histories)  # warm-up: the tables kept per state of the weights are made here
    sources: dict[str, list[float]] = {}
    calls = []
    for _ in range(repeats):
        start = time.perf_counter()
        ranker.score(histories)
        calls.append(time.perf_counter() - start)
        for call in ranker.last_source_calls:
            sources.setdefault(call.source, []).append(call.seconds)
    whole, first = statistics.median(calls), median_seconds(lambda: baseline.score(histories), repeats)
    return {
        "candidates": significant(float(found.real.sum(dim=1).float().mean())),
        "ranker_ms": significant(whole * 1e3),
        "baseline_ms": significant(first * 1e3),
        "ratio": significant(whole / first),
        "sources_ms": {name: significant(statistics.median(seconds) * 1e3) for name, seconds in sources.items()},
        "ranking_ms": significant(rank * 1e3),
    }


if __name__ == "__main__":
    main()
