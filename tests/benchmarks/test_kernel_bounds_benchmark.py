"""The kernel-bounds benchmark: ncu's CSV read into each kernel's figures and bound (on the CSVs an H200 run kept),
its command line, and on a GPU with ncu a live probe that sees the backward's kernels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.common import REPO
from benchmarks.kernels import bounds
from recsys.errors import ConfigError

KEPT = "benchmarks/results/kernels-bounds-h200"
COMMITTED = REPO / "benchmarks/results/kernels-bounds-h200.json"


def test_the_kept_csvs_give_the_committed_result(tmp_path: Path) -> None:
    committed = json.loads(COMMITTED.read_text())
    overrides = committed["reproduce"]["overrides"]
    args = [f"{key}={value}" for key, value in overrides.items()]
    path = bounds.main(["--results-dir", str(tmp_path), *[a for arg in args for a in ("--set", arg)]])
    assert json.loads(path.read_text())["probes"] == committed["probes"]


def test_the_long_attention_forward_is_latency_bound_at_register_limited_occupancy() -> None:
    probe = json.loads(COMMITTED.read_text())["probes"]["hstu-s64-fwd_bwd"]
    top = probe["kernels"][0]
    assert top["kernel"] == "_forward_kernel" and top["share"] > 0.9
    assert top["bound"] == "latency" and max(top["dram_pct"], top["memory_pct"], top["sm_pct"]) < 60
    assert top["theoretical_occupancy_pct"] == 12.5 and "registers" in top["ncu_occupancy_limit"]
    assert sum(k["share"] for k in probe["kernels"]) == pytest.approx(1, abs=1e-3)


@pytest.mark.parametrize(
    ("dram", "memory", "sm", "bound"),
    [(81.6, 81.6, 45.9, "memory"), (5.5, 92.4, 36.3, "memory"), (10.0, 20.0, 75.0, "compute"),
     (28.6, 59.4, 36.6, "latency"), (None, None, None, "latency")],
)  # fmt: skip
def test_the_bound_follows_ncus_sixty_percent_rule(
    dram: float | None, memory: float | None, sm: float | None, bound: str
) -> None:
    assert bounds.bound_of(dram, memory, sm) == bound


def test_the_old_launch_order_read_the_512_x_1024_forwards_keys_again_from_dram() -> None:
    """The H200 profile before the launch order took a sequence's blocks together: its forward moved 4x the bytes
    its inputs and output need (the kernel benchmark's count for the case), missing L2 on 92 % of requests, with no
    spilled registers: what docs/kernels.md names as that row's bound."""
    forward = json.loads(COMMITTED.read_text())["probes"]["hstu-s512-fwd_bwd"]["kernels"][0]
    needed = json.loads((REPO / "benchmarks/results/kernels-hstu-attention-h200-tma-bwd-s512-l1024.json").read_text())
    needed_gb = needed["cases"][0]["fwd"]["bytes"] / 1e9
    assert forward["kernel"] == "_forward_kernel"
    assert forward["dram_gb"] > 3.5 * needed_gb and forward["l2_hit_pct"] < 10 and forward["spilling_requests"] == 0


def test_dram_bytes_read_the_throughputs_unit() -> None:
    def row(section: str, name: str, value: str, unit: str) -> dict[str, str]:
        return {"ID": "0", "Kernel Name": "k", "Grid Size": "(1, 1, 1)", "Block Size": "(32, 1, 1)",
                "Section Name": section, "Metric Name": name, "Metric Value": value, "Metric Unit": unit}  # fmt: skip

    duration = row("GPU Speed Of Light Throughput", "Duration", "2,000,000", "ns")
    for value, unit in (("1.5", "Tbyte/s"), ("1,500", "Gbyte/s"), ("1,500,000,000,000", "byte/s")):
        kernel = bounds.summarise([duration, row("Memory Workload Analysis", "Memory Throughput", value, unit)])
        assert kernel["kernels"][0]["dram_gb"] == pytest.approx(3.0)
    unknown = bounds.summarise([duration, row("Memory Workload Analysis", "Memory Throughput", "1.5", "%")])
    assert unknown["kernels"][0]["dram_gb"] is None


def test_a_kernel_without_its_duration_is_refused() -> None:
    row = {"ID": "0", "Kernel Name": "k", "Grid Size": "(1, 1, 1)", "Block Size": "(32, 1, 1)",
           "Section Name": "Occupancy", "Metric Name": "Achieved Occupancy", "Metric Value": "50"}  # fmt: skip
    with pytest.raises(ValueError, match="no Duration"):
        bounds.summarise([row])


def test_the_capture_picks_ncus_window() -> None:
    settings = bounds.load_settings(REPO / "benchmarks/configs/kernels-bounds.yaml", {})
    probe = settings.probes[0]
    api = bounds.ncu_command("ncu", settings, probe)
    assert api[1:3] == ["--profile-from-start", "off"] and json.loads(api[-1])["capture"] == "profiler_api"
    nvtx = bounds.ncu_command("ncu", bounds.load_settings(REPO / "benchmarks/configs/kernels-bounds.yaml",
                                                          {"capture": "nvtx"}), probe)  # fmt: skip
    assert nvtx[1:4] == ["--nvtx", "--nvtx-include", "probe/"]
    assert [nvtx[i + 1] for i, arg in enumerate(nvtx) if arg == "--section"] == list(bounds.SECTIONS)


def test_settings_refuse_what_cannot_run(tmp_path: Path) -> None:
    config = REPO / "benchmarks/configs/kernels-bounds.yaml"
    with pytest.raises(ConfigError, match="distinct file names"):
        bounds.load_settings(config, {"probes": [{"name": "a b", "bench": "embedding_bag", "case": "fwd-fp32"}]})
    with pytest.raises(SystemExit, match="result_name"):
        bounds.main(["--results-dir", str(tmp_path), "--set", f"from_csv={KEPT}"])
    with pytest.raises(SystemExit, match="from_csv: no"):
        bounds.main(["--results-dir", str(tmp_path), "--set", f"from_csv={tmp_path}", "--set", "result_name=x"])


@pytest.mark.gpu
def test_ncu_sees_the_backward_kernels_of_a_live_probe(tmp_path: Path) -> None:
    if not torch.cuda.is_available() or bounds.find_ncu() is None:
        pytest.skip("needs CUDA and Nsight Compute (ncu)")
    probe = {"name": "smoke", "bench": "hstu_attention", "case": "smoke", "step": "fwd_bwd"}
    path = bounds.main(["--results-dir", str(tmp_path), "--set", "probes=[" + json.dumps(probe) + "]",
                        "--set", "attention_config=benchmarks/configs/kernels-hstu-attention-smoke.yaml"])  # fmt: skip
    kernels = {k["kernel"] for k in json.loads(path.read_text())["probes"]["smoke"]["kernels"]}
    assert {"_forward_kernel", "_dkdv_kernel", "_dq_kernel"} <= kernels, kernels
    assert (tmp_path / path.stem / "smoke.csv.gz").is_file()


@pytest.mark.parametrize("config", ["kernels-bounds.yaml", "kernels-bounds-all.yaml"])
def test_every_probe_names_a_case_of_its_bench(config: str) -> None:
    from benchmarks.kernels import embedding_bag, hstu_attention

    settings = bounds.load_settings(REPO / "benchmarks/configs" / config, {})
    bags = embedding_bag.load_settings(REPO / settings.embedding_bag_config, {})
    cases = {
        "embedding_bag": {c.name for c in embedding_bag.all_cases(bags)},
        "hstu_attention": {c.name for c in hstu_attention.load_settings(REPO / settings.attention_config, {}).cases},
    }
    assert settings.probes and all(probe.case in cases[probe.bench] for probe in settings.probes)


def test_the_probe_steps_run_one_case_of_each_bench() -> None:
    """What ncu profiles: a case's step from each bench's config (here the smoke configs, on the CPU in Triton's
    interpreter), runnable again and again."""
    from benchmarks.kernels import bounds_probe

    cpu = torch.device("cpu")
    bag = bounds_probe.embedding_bag_step(REPO / "benchmarks/configs/kernels-embedding-bag-smoke.yaml",
                                          "fwd_bwd_sgd-fp32", cpu)  # fmt: skip
    attention = bounds_probe.attention_step(REPO / "benchmarks/configs/kernels-hstu-attention-smoke.yaml",
                                            "smoke-jagged-time", "fwd_bwd", cpu)  # fmt: skip
    for step in (bag, attention, bag):
        step()
    grads = attention()
    assert grads and all(torch.isfinite(g).all() for g in grads)
