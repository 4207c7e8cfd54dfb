"""The kernel benchmark's smoke config: every case runs (and checks itself), and the JSON has the issue's fields and
how to reproduce it."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from benchmarks.common import REPO
from benchmarks.kernels import embedding_bag
from benchmarks.reproduce import problems_of
from recsys.errors import ConfigError

pytestmark = pytest.mark.kernels

SMOKE = "benchmarks/configs/kernels-embedding-bag-smoke.yaml"

TOP_LEVEL = {"gpu": str, "torch": str, "triton": str, "copy_GBps": float, "cases": list, "machine": dict,
             "versions": dict, "command": str}  # fmt: skip
CASE_FIELDS = {"op", "dtype", "rows", "dim", "batch", "pool", "tables", "ids", "ms", "GBps", "torch_ms",
               "torch_GBps", "ratio_vs_torch", "fraction_of_copy"}  # fmt: skip
POSITIVE = ["rows", "dim", "batch", "pool", "tables", "ms", "GBps", "torch_ms", "torch_GBps", "ratio_vs_torch",
            "fraction_of_copy", "bytes", "unique_rows"]  # fmt: skip


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fbgemm_gpu's own import-time notices
@pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")  # torch's sparse Adagrad
def test_smoke_run_writes_the_issue_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = embedding_bag.main(["--config", str(REPO / SMOKE), "--results-dir", str(tmp_path)])
    _, slug = embedding_bag.gpu_name(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    assert path == tmp_path / f"kernels-embedding-bag-{slug}-smoke.json"
    result = json.loads(path.read_text())
    for key, kind in TOP_LEVEL.items():
        assert isinstance(result[key], kind), key
    assert result["copy_GBps"] > 0 and result["smoke"] is True

    cases = result["cases"]
    ops = {c["op"] for c in cases}
    assert set(embedding_bag.OPS) <= ops
    assert {c["dtype"] for c in cases} == {"float32", "bfloat16"}
    assert {c["ids"] for c in cases} == {"uniform", "zipf"}
    assert any(c["tables"] > 1 for c in cases)
    for case in cases:
        assert CASE_FIELDS <= case.keys(), CASE_FIELDS - case.keys()
        bad = [key for key in POSITIVE if not (isinstance(case[key], int | float) and 0 < case[key] < math.inf)]
        assert not bad, (case["name"], bad)
        assert case["checked"]  # each case checked its Triton result before timing
    printed = capsys.readouterr().out  # the table
    assert all(c["name"] in printed for c in cases)
    assert result["reproduce"] == {"benchmark": "benchmarks.kernels.embedding_bag", "config": SMOKE, "overrides": {}}
    assert result["settings"]["rows"] == 1_000 and result["settings"]["smoke"] is True
    assert problems_of(path) == []


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_set_picks_cases_and_is_recorded(tmp_path: Path) -> None:
    args = ["--config", str(REPO / SMOKE), "--set", "cases=[fwd-bf16]", "--set", "dim=8"]
    path = embedding_bag.main([*args, "--results-dir", str(tmp_path)])
    result = json.loads(path.read_text())
    assert [(c["name"], c["dim"]) for c in result["cases"]] == [("fwd-bf16", 8)]
    assert result["reproduce"]["overrides"] == {"cases": ["fwd-bf16"], "dim": 8}
    assert problems_of(path) == []
    result["cases"][0]["dim"] = 16  # a result that no longer matches its record is found out
    path.write_text(json.dumps(result))
    assert problems_of(path) == ["cases[fwd-bf16].dim: the result has 16, the config 8"]


def test_unknown_cases_and_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"cases: unknown \['fwd-fp64'\]"):
        embedding_bag.load_settings(REPO / SMOKE, {"cases": ["fwd-fp64"]})
    with pytest.raises(ConfigError, match="row: unknown key"):
        embedding_bag.load_settings(REPO / SMOKE, {"row": 10})


def test_zipf_ids_are_skewed_and_in_range() -> None:
    gen = torch.Generator().manual_seed(0)
    ids = embedding_bag.zipf_ids(1_000, 20_000, 1.15, gen, torch.device("cpu"))
    assert ids.min() >= 0 and ids.max() < 1_000
    counts = torch.bincount(ids, minlength=1_000).sort(descending=True).values
    # rank 1 holds 1 / H(1000, 1.15) ~ 23% of the ids; a uniform draw would give each row ~0.1%
    assert 0.18 < counts[0] / ids.numel() < 0.28
    assert counts[0] > 1.8 * counts[1]


def test_bytes_are_counted_per_op() -> None:
    c = embedding_bag.Case("x", "fwd", torch.float32, rows=100, dim=4, batch=2, pool=3, tables=1, ids="uniform")
    # 6 rows of 16 bytes read + 6 int64 ids + 3 int64 offsets + 2 pooled rows of 16 bytes written
    assert embedding_bag.case_bytes(c, unique_rows=5) == 6 * 16 + 6 * 8 + 3 * 8 + 2 * 16
    sgd = embedding_bag.case_bytes(replace(c, op="fwd_bwd_sgd"), unique_rows=5)
    # + the output gradient (2 x 16) + ids and offsets again + 5 touched rows read and written
    assert sgd == embedding_bag.case_bytes(c, unique_rows=5) + 2 * 16 + 6 * 8 + 3 * 8 + 2 * 5 * 16
    adagrad = embedding_bag.case_bytes(replace(c, op="fwd_bwd_rowwise_adagrad"), unique_rows=5)
    assert adagrad == sgd + 2 * 5 * 4


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_case_out_of_memory_is_recorded_and_the_run_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_problem = embedding_bag.make_problem

    def short_of_memory(c: embedding_bag.Case, *args: object, **kwargs: object) -> embedding_bag.Problem:
        if c.name == "fwd_bwd_adam-fp32":  # as the Adam case on a GPU another framework had filled
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.77 GiB")
        return make_problem(c, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(embedding_bag, "make_problem", short_of_memory)
    args = ["--config", str(REPO / SMOKE), "--set", "cases=[fwd-fp32, fwd-bf16, fwd_bwd_adam-fp32]"]
    path = embedding_bag.main([*args, "--results-dir", str(tmp_path)])
    result = json.loads(path.read_text())
    assert problems_of(path) == []  # a run with a failed case still matches its config
    assert [c["name"] for c in result["cases"]] == ["fwd-fp32", "fwd-bf16", "fwd_bwd_adam-fp32"]  # the cases' order
    failed = result["cases"][2]
    assert result["failed"] == ["fwd_bwd_adam-fp32"] and failed["error"].startswith("OutOfMemoryError: CUDA out of")
    assert failed["op"] == "fwd_bwd_adam" and failed["rows"] == 1_000 and "ms" not in failed
    assert all(case["ms"] > 0 for case in result["cases"][:2])  # the others are measured
    if torch.cuda.is_available():
        assert set(failed["memory"]) == {"total", "free", "torch_reserved", "held_elsewhere"}
        assert result["memory_at_start"]["total"] == failed["memory"]["total"]
    else:
        assert failed["memory"] is None and result["memory_at_start"] is None  # no GPU memory to report


def test_a_gpu_mostly_held_outside_torch_is_named_before_the_first_case(caplog: pytest.LogCaptureFixture) -> None:
    gib = 2**30
    embedding_bag.warn_if_held_elsewhere({"total": 80 * gib, "free": 19 * gib, "torch_reserved": gib,
                                          "held_elsewhere": 60 * gib})  # fmt: skip
    assert "60.0 of 80.0 GiB of the GPU is held outside" in caplog.text and "JAX_PLATFORMS=cpu" in caplog.text
    caplog.clear()
    embedding_bag.warn_if_held_elsewhere({"total": 80 * gib, "free": 79 * gib, "torch_reserved": 0,
                                          "held_elsewhere": gib})  # fmt: skip
    embedding_bag.warn_if_held_elsewhere(None)  # CPU
    assert caplog.text == ""
