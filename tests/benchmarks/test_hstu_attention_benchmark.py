"""The HSTU attention benchmark's smoke config: every case runs and checks itself, both training steps run, and the
JSON has its fields and how to reproduce it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from benchmarks.common import REPO
from benchmarks.kernels import hstu_attention
from benchmarks.kernels.embedding_bag import gpu_name
from benchmarks.reproduce import problems_of
from recsys.errors import ConfigError

pytestmark = pytest.mark.kernels

SMOKE = "benchmarks/configs/kernels-hstu-attention-smoke.yaml"
TIMING = {"ms", "torch_ms", "ratio_vs_torch", "flops", "TFLOPs", "torch_TFLOPs", "bytes", "GBps"}


def positive(value: object) -> bool:
    return isinstance(value, int | float) and 0 < value < math.inf


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_smoke_run_writes_its_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = hstu_attention.main(["--config", str(REPO / SMOKE), "--results-dir", str(tmp_path)])
    _, slug = gpu_name(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    assert path == tmp_path / f"kernels-hstu-attention-{slug}-smoke.json"
    result = json.loads(path.read_text())
    assert result["smoke"] is True and result["torch_impl"] == "eager TORCH backend"
    assert {"gpu", "torch", "triton", "timer", "notes", "machine", "versions", "command"} <= result.keys()

    assert [(c["name"], c["lengths"], c["time_buckets"]) for c in result["cases"]] == [
        ("smoke", "full", 0),
        ("smoke-jagged-time", "jagged", 8),
    ]
    for case in result["cases"]:
        assert case["tokens"] >= case["seq_len"] and case["causal_pairs"] > 0
        # every kernel's chosen config (the interpreter's one; a GPU's autotuned pick, TMA or not, for the forward)
        assert set(case["tuned"]) == {"_forward_kernel", "_dkdv_kernel", "_dq_kernel"}, case["tuned"]
        assert case["tuned"]["_forward_kernel"]["TMA"] in (False, True) and case["tuned"]["_dq_kernel"]["BLOCK_M"] > 0
        for step in ("fwd", "fwd_bwd"):
            timing = case[step]
            assert TIMING <= timing.keys() and all(positive(timing[key]) for key in TIMING), (case["name"], step)
            assert timing["ratio_vs_torch"] == pytest.approx(timing["torch_ms"] / timing["ms"], rel=1e-2)
            if torch.cuda.is_available():  # the GPU's busy time per call, by kernel, and its share of the time
                gpu = timing["gpu"]
                assert positive(gpu["busy_ms"]) and gpu["busy_ms"] == pytest.approx(
                    timing["ms"] * gpu["busy_share"], rel=0.05
                )
                assert any("kernel" in name for name in gpu["kernels_ms"]), gpu["kernels_ms"]
                # kernels only (an operator's device time is its kernels' again), so one stream is never busier than
                # the call: the long-shape rows come out near 1
                assert not any(
                    name.startswith(("aten::", "recsys::", "GeneratedBackwardFor")) for name in gpu["kernels_ms"]
                )
                assert gpu["busy_share"] <= 1.2, gpu
                assert gpu["host_ms"] and all(positive(t) for t in gpu["host_ms"].values()), gpu["host_ms"]
                # the replayed graph does the call's GPU work without its host work: never much slower
                assert positive(timing["graphed_ms"]) and timing["graphed_ms"] <= 1.2 * timing["ms"], timing
            else:
                assert "gpu" not in timing and "graphed_ms" not in timing
        assert case["fwd_bwd"]["flops"] == 3 * case["fwd"]["flops"]
        checked = case["checked_relative_error"]  # the Triton result against torch's, before timing
        assert checked.keys() == {"out", "qkvu", "position_bias", *(["time_bias"] if case["time_buckets"] else [])}
        assert all(error <= 2e-2 for error in checked.values())
    (step,) = result["steps"]
    assert step["name"] == "smoke" and positive(step["torch_ms"]) and positive(step["triton_ms"])
    printed = capsys.readouterr().out  # the table
    assert all(c["name"] in printed for c in result["cases"]) and "training step smoke" in printed

    assert result["reproduce"] == {"benchmark": "benchmarks.kernels.hstu_attention", "config": SMOKE, "overrides": {}}
    assert problems_of(path) == []
    result["cases"][1]["seq_len"] = 21  # a result that no longer matches its config is found out
    path.write_text(json.dumps(result))
    assert problems_of(path) == ["cases[smoke-jagged-time].seq_len: the result has 21, the config 20"]


def test_work_is_counted_on_the_causal_pairs() -> None:
    c = hstu_attention.AttentionCase("x", num_seqs=2, seq_len=4, heads=2, head_dim=8, lengths="full", time_buckets=0)
    p = hstu_attention.make_problem(c, torch.bfloat16, seed=0, device=torch.device("cpu"))
    assert hstu_attention.causal_pairs(p) == 2 * (4 * 5 // 2)
    # 2 matmuls forward, 4 backward, 2 flops per multiply-add over E=8 dims and H=2 heads
    assert hstu_attention.flops(c, p, "fwd") == 20 * 2 * 2 * 8 * 2
    assert hstu_attention.flops(c, p, "fwd_bwd") == 3 * hstu_attention.flops(c, p, "fwd")
    tensor = 8 * 2 * 8 * 2  # one (N=8, H=2, E=8) bf16 tensor
    assert hstu_attention.bytes_moved(c, p, "fwd") == 4 * tensor
    assert hstu_attention.bytes_moved(c, p, "fwd_bwd") == 11 * tensor


def test_jagged_lengths_reach_the_longest_and_stay_above_half() -> None:
    c = hstu_attention.AttentionCase(
        "x", num_seqs=50, seq_len=30, heads=1, head_dim=8, lengths="jagged", time_buckets=0
    )
    lengths = hstu_attention.sequence_lengths(c, torch.Generator().manual_seed(0))
    assert int(lengths[0]) == 30 and int(lengths.min()) >= 15 and int(lengths.max()) == 30
    assert len(set(lengths.tolist())) > 5


def test_the_full_config_loads_the_issue_cases() -> None:
    settings = hstu_attention.load_settings(REPO / "benchmarks/configs/kernels-hstu-attention.yaml", {})
    shapes = {(c.num_seqs, c.seq_len, c.heads, c.head_dim, c.lengths) for c in settings.cases}
    assert {(128, 200, 2, 64, "full"), (128, 200, 2, 64, "jagged"), (32, 1024, 2, 64, "full")} <= shapes
    assert settings.dtype == "bfloat16" and settings.compile_torch and not settings.smoke
    assert [(s.num_items, s.dim, s.num_heads, s.rows, s.max_history) for s in settings.steps] == [
        (12_101, 64, 2, 16, 50)
    ]
    with pytest.raises(ConfigError, match=r"cases\.0: unknown keys \[.lenghts.\]"):
        hstu_attention.load_settings(REPO / SMOKE, {"cases": [{"name": "x", "lenghts": "full"}]})


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_case_without_torch_is_checked_on_two_sequences_and_the_sdpa_anchors_say_why_they_did_not_run(
    tmp_path: Path,
) -> None:
    case = (
        "{name: alone, num_seqs: 4, seq_len: 20, heads: 2, head_dim: 16, lengths: jagged, time_buckets: 0, "
        "compare_torch: false}"
    )
    path = hstu_attention.main(["--config", str(REPO / SMOKE), "--set", f"cases=[{case}]", "--set", "steps=[]",
                                "--set", "sdpa_backends=[cudnn, flash]", "--results-dir", str(tmp_path)])  # fmt: skip
    (result,) = json.loads(path.read_text())["cases"]

    assert result["checked_on"] == "2 sequences of this shape, eager torch"
    assert all(error <= 2e-2 for error in result["checked_relative_error"].values())
    for step in ("fwd", "fwd_bwd"):
        assert positive(result[step]["TFLOPs"]) and "torch_ms" not in result[step]  # ours alone
        if not torch.cuda.is_available():
            assert result[step]["sdpa"] == {b: {"skipped": "SDPA's cudnn and flash backends need CUDA"}
                                            for b in ("cudnn", "flash")}  # fmt: skip
        else:
            assert all("ms" in a or "error" in a for a in result[step]["sdpa"].values())
            assert all(positive(a["graphed_ms"]) for a in result[step]["sdpa"].values() if "ms" in a)


def test_the_long_config_holds_the_issue_shapes_with_their_anchors() -> None:
    settings = hstu_attention.load_settings(REPO / "benchmarks/configs/kernels-hstu-attention-long.yaml", {})
    shapes = [(c.num_seqs, c.seq_len, c.heads, c.head_dim, c.compare_torch) for c in settings.cases]
    assert shapes == [(64, 4096, 4, 128, False), (512, 1024, 4, 128, False), (32, 1024, 2, 64, True),
                      (128, 200, 2, 64, True)]  # fmt: skip
    assert settings.sdpa_backends == ("cudnn", "flash") and not settings.smoke


def test_a_configured_peer_checkout_must_hold_the_peer_kernel(tmp_path: Path) -> None:
    settings = hstu_attention.load_settings(REPO / SMOKE, {"peer_checkout": str(tmp_path), "peer_commit": "abc"})
    with pytest.raises(ConfigError, match=r"has no generative_recommenders/ops/triton/triton_hstu_attention\.py"):
        hstu_attention.check_peer(settings)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_peer_runs_in_a_process_of_its_own_and_its_failure_is_recorded(tmp_path: Path) -> None:
    # a checkout whose kernel file imports nothing usable (beside the peer's `common`, imported first): on CUDA its
    # process fails, without CUDA it never starts
    kernel = tmp_path / "peer" / hstu_attention.PEER_FILE
    kernel.parent.mkdir(parents=True)
    kernel.write_text("raise ImportError('not the peer')\n")
    (tmp_path / "peer/generative_recommenders/common.py").write_text("")
    case = "{name: peer, num_seqs: 2, seq_len: 20, heads: 2, head_dim: 16, lengths: full, time_buckets: 0}"
    path = hstu_attention.main(["--config", str(REPO / SMOKE), "--set", f"cases=[{case}]", "--set", "steps=[]",
                                "--set", f"peer_checkout={tmp_path / 'peer'}", "--set", "peer_commit=none",
                                "--results-dir", str(tmp_path)])  # fmt: skip
    (result,) = json.loads(path.read_text())["cases"]

    for step in ("fwd", "fwd_bwd"):
        peer = result[step]["peer"]
        if torch.cuda.is_available():
            assert "not the peer" in peer["error"] and positive(result[step]["TFLOPs"])  # ours still timed
        else:
            assert peer == {"skipped": "the peer's Triton kernel needs CUDA"}


@pytest.mark.gpu
def test_the_pinned_peer_kernel_is_timed_on_cuda() -> None:
    checkout = REPO / ".cache/peers/generative-recommenders"
    if not torch.cuda.is_available() or not (checkout / hstu_attention.PEER_FILE).is_file():
        pytest.skip(f"needs CUDA and the peer's checkout at {checkout} (docs/kernels.md)")
    c = hstu_attention.AttentionCase("peer", num_seqs=8, seq_len=256, heads=2, head_dim=64, lengths="jagged",
                                     time_buckets=0)  # fmt: skip
    settings = hstu_attention.load_settings(REPO / SMOKE, {"peer_checkout": str(checkout), "peer_commit": "pinned"})
    timings = hstu_attention.peer_timings(c, settings, torch.device("cuda"))
    assert all(positive(timings[step]["ms"]) and positive(timings[step]["TFLOPs"]) for step in ("fwd", "fwd_bwd"))
