"""The domains benchmark end to end on two tiny P5-form domains: every stage, then the report's table."""

from __future__ import annotations

import json
import random
from pathlib import Path

import benchmarks.domain_adapters as domain_adapters
from benchmarks.reproduce import problems_of


def _p5_domain(folder: Path, items: int, users: int, seed: int) -> None:
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    lines = [" ".join([str(u), *(str(rng.randrange(items)) for _ in range(rng.randint(4, 9)))]) for u in range(users)]
    (folder / "user_sequence.txt").write_text("\n".join(lines) + "\n")


def test_every_stage_over_seeds_then_the_report(tmp_path: Path) -> None:
    _p5_domain(tmp_path / "raw" / "amazon-toys", items=40, users=60, seed=0)
    _p5_domain(tmp_path / "raw" / "amazon-games", items=30, users=50, seed=1)
    experiment = (f"{{data.path: {tmp_path / 'raw'}, data.options.domains: [amazon-toys, amazon-games], "
                  "train.schedule.epochs: 1, train.hardware.device: cpu}")  # fmt: skip
    variants = ("{rank2-embedding0-lr0.002: {model.params.rank: 2}, "
                "rank2-embedding1-lr0.002: {model.params.rank: 2, model.params.embedding_rank: 1}}")  # fmt: skip
    common = ["--set", f"experiment={experiment}", "--set", "domains=[games, toys]", "--set", "seeds=[0, 1]",
              "--set", f"variants={variants}", "--work-dir", str(tmp_path / "work")]  # fmt: skip
    domain_adapters.main(["--stage", "shared", "--seed", "0", *common])  # one part on its own ...
    path = domain_adapters.main(["--stage", "all", *common, "--results-dir", str(tmp_path)])  # ... then every part
    assert path is not None and problems_of(path) == []
    table = json.loads(path.read_text())["domains"]
    assert set(table) == {"games", "toys"}
    for row in table.values():
        assert set(row["a_shared"]["ndcg@10_per_seed"]) == set(row["b_separate"]["ndcg@10_per_seed"]) == {"0", "1"}
        adapters = row["c_base_plus_adapters"]
        assert set(adapters) == {"rank2-embedding0-lr0.002", "rank2-embedding1-lr0.002"}
        # the item adapter adds its domain's rows to the block adapter's parameters
        assert 0 < adapters["rank2-embedding0-lr0.002"]["adapter_share_of_base"]
        assert (
            adapters["rank2-embedding0-lr0.002"]["adapter_share_of_base"]
            < adapters["rank2-embedding1-lr0.002"]["adapter_share_of_base"]
            < 1
        )
        for summary in (row["a_shared"], row["b_separate"], *adapters.values()):
            values = list(summary["ndcg@10_per_seed"].values())
            assert len(values) == 2 and all(0 <= v <= 1 for v in values)
            assert summary["ndcg@10_mean"] == sum(values) / 2
        for summary in adapters.values():
            assert isinstance(summary["c_at_least_max_a_b_on_mean"], bool)
            assert 0 <= summary["seeds_where_c_at_least_max_a_b"] <= 2
