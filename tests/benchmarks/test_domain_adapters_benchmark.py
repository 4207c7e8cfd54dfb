"""The domains benchmark end to end on two tiny P5-form domains: every stage, then the report's table."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.benchmarks.conftest import load_benchmark


def _p5_domain(folder: Path, items: int, users: int, seed: int) -> None:
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    lines = [" ".join([str(u), *(str(rng.randrange(items)) for _ in range(rng.randint(4, 9)))]) for u in range(users)]
    (folder / "user_sequence.txt").write_text("\n".join(lines) + "\n")


def test_every_stage_then_the_report(tmp_path: Path) -> None:
    _p5_domain(tmp_path / "raw" / "amazon-toys", items=40, users=60, seed=0)
    _p5_domain(tmp_path / "raw" / "amazon-games", items=30, users=50, seed=1)
    bench = load_benchmark("domain_adapters.py")
    common = ["--data-dir", str(tmp_path / "raw"), "--domains", "amazon-toys", "amazon-games"]
    common += ["--work-dir", str(tmp_path / "work"), "--epochs", "1", "--device", "cpu"]
    bench.main(["--stage", "shared", *common])
    for domain in ("toys", "games"):
        bench.main(["--stage", "separate", "--domain", domain, *common])
        bench.main(["--stage", "adapters", "--domain", domain, *common])
    path = bench.main(["--stage", "report", *common, "--results-dir", str(tmp_path)])
    table = json.loads(path.read_text())["domains"]
    assert set(table) == {"games", "toys"}
    for row in table.values():
        assert {"a_shared", "b_separate", "c_base_plus_adapter"} <= set(row)
        assert 0 < row["adapter_share_of_base"] < 1
        assert isinstance(row["c_at_least_max_a_b"], bool)
        assert all(0 <= row[v]["ndcg@10"] <= 1 for v in ("a_shared", "b_separate", "c_base_plus_adapter"))
