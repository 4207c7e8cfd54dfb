"""What bounds each kernel of a kernel benchmark's case: Nsight Compute's speed-of-light, occupancy and launch figures
for every kernel one call of the step launches, with the bound they name; writes JSON.

Usage:
    .venv/bin/python -m benchmarks.kernels.bounds                # on a CUDA GPU with Nsight Compute (`ncu`)
    .venv/bin/python -m benchmarks.kernels.bounds --set from_csv=DIR --set result_name=kernels-bounds-h200
        # summarise ncu CSVs an earlier run kept (DIR/<probe>.csv or .csv.gz), anywhere

Settings: benchmarks/configs/kernels-bounds.yaml (`--config`, `--set KEY=VALUE`): `probes` (each a name, the bench
`embedding_bag` or `hstu_attention`, a case of that bench's config and, for attention, the step), the two benches'
configs, `calls` per probe, `capture` (which kernels ncu sees: `profiler_api`, every thread's; `nvtx`, the calling
thread's only, so not autograd's backward), `timeout_s` per probe, `from_csv`, `result_name`.

Each probe runs `ncu --csv --page details` with the sections below over `python -m benchmarks.kernels.bounds_probe`
(the step warmed up outside the capture, then `calls` calls inside it), in a process of its own. ncu replays every
kernel once per metric pass with the clocks locked at base, so its durations are longer than do_bench's: read them as
shares of the step, not as its time. Per kernel the result keeps its duration and share, DRAM / memory / SM
throughput as % of peak, the gigabytes it moved to and from DRAM, its L1 and L2 hit rates, its registers' spills,
achieved and theoretical occupancy, registers per thread, what limits occupancy and ncu's speed-of-light verdict.
`bound`: "memory" when DRAM or memory throughput reaches 60 % of peak, "compute" when SM throughput does, else
"latency" (ncu's own rule: both below 60 % of peak indicate latency). The raw CSVs are kept gzipped in
benchmarks/results/<result_name>/.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import re
import shutil
import subprocess
import sys
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import PositiveInt

from benchmarks.common import (
    REPO,
    benchmark_parser,
    parse_run,
    provenance,
    result_name_for,
    settings_from,
    significant,
    write_result,
)
from benchmarks.kernels.embedding_bag import gpu_name
from recsys.errors import ConfigError
from recsys.runtime.atomic import atomic_file

logger = logging.getLogger("benchmarks.kernels.bounds")

SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis", "Occupancy", "WarpStateStats",
            "LaunchStats")  # fmt: skip
SOL = "GPU Speed Of Light Throughput"
SOL_THROUGHPUTS = ("DRAM Throughput", "Memory Throughput", "Compute (SM) Throughput")  # % of peak, in that section
MEMORY = "Memory Workload Analysis"  # its "Memory Throughput" is DRAM's, in bytes per second
BYTES_PER_S = {"byte/s": 1.0, "Kbyte/s": 1e3, "Mbyte/s": 1e6, "Gbyte/s": 1e9, "Tbyte/s": 1e12}
BOUND_AT_PCT = 60.0  # ncu's speed-of-light rule: below this share of peak in both, the kernel waits on latency


@dataclass(frozen=True)
class Probe:
    name: str  # the CSV's and the result entry's name
    bench: Literal["embedding_bag", "hstu_attention"]
    case: str  # a case of that bench's config
    step: Literal["fwd", "fwd_bwd"] = "fwd_bwd"  # attention only (an embedding-bag case names its op)


@dataclass(frozen=True)
class Settings:
    probes: tuple[Probe, ...]
    embedding_bag_config: str = "benchmarks/configs/kernels-embedding-bag.yaml"
    attention_config: str = "benchmarks/configs/kernels-hstu-attention-long.yaml"
    calls: PositiveInt = 1
    capture: Literal["profiler_api", "nvtx"] = "profiler_api"
    timeout_s: PositiveInt = 170
    from_csv: str | None = None
    result_name: str = "kernels-bounds-{device}"

    def __post_init__(self) -> None:
        names = [p.name for p in self.probes]
        if len(set(names)) != len(names) or any(not re.fullmatch(r"[A-Za-z0-9_.-]+", n) for n in names):
            raise ConfigError(f"probes: names {names} must be distinct file names. Fix: letters, digits, . _ - only")


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


# ------------------------------------------------------------------------------------------- reading ncu's CSV


def read_ncu_csv(text: str) -> list[dict[str, str]]:
    """The rows of `ncu --csv --page details` output (its own ==PROF== lines and the program's output skipped)."""
    return list(csv.DictReader(io.StringIO("".join(line for line in text.splitlines(True) if line.startswith('"')))))


def _number(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value.replace(",", ""))
    except ValueError:
        return None  # ncu writes "no data" for a metric it could not collect


def _rule(rows: list[dict[str, str]], name: str) -> str | None:
    descriptions = [r["Rule Description"] for r in rows if r.get("Rule Name") == name and r.get("Rule Description")]
    return descriptions[0] if descriptions else None


def _dram_gb(throughput: str | None, unit: str | None, duration_ns: float) -> float | None:
    """Gigabytes a kernel moved to and from DRAM: its DRAM throughput (in `unit`, one of BYTES_PER_S) x its duration;
    None where ncu gave no throughput or another unit."""
    per_s, scale = _number(throughput), BYTES_PER_S.get(unit or "")
    return None if per_s is None or scale is None else significant(per_s * scale * duration_ns / 1e18)


def bound_of(dram_pct: float | None, memory_pct: float | None, sm_pct: float | None) -> str:
    """`memory` or `compute` where that throughput reaches BOUND_AT_PCT of peak, else `latency`."""
    memory = max(dram_pct or 0.0, memory_pct or 0.0)
    if max(memory, sm_pct or 0.0) < BOUND_AT_PCT:
        return "latency"
    return "memory" if memory >= (sm_pct or 0.0) else "compute"


def summarise(rows: list[dict[str, str]]) -> dict[str, Any]:
    """Every kernel ncu profiled (by its ID, longest first) with its figures and bound, and the step's total."""
    by_kernel: OrderedDict[str, list[dict[str, str]]] = OrderedDict()
    for row in rows:
        by_kernel.setdefault(row["ID"], []).append(row)
    kernels: list[dict[str, Any]] = []
    for kernel_rows in by_kernel.values():
        metric = {(r["Section Name"], r["Metric Name"]): r["Metric Value"] for r in kernel_rows if r["Metric Name"]}
        unit = {(r["Section Name"], r["Metric Name"]): r.get("Metric Unit", "") for r in kernel_rows}
        duration_ns = _number(metric.get((SOL, "Duration")))
        if duration_ns is None:
            raise ValueError(
                f"kernel {kernel_rows[0]['Kernel Name'][:80]!r} has no Duration: was SpeedOfLight collected?"
            )
        dram, memory, sm = (_number(metric.get((SOL, m))) for m in SOL_THROUGHPUTS)
        kernels.append({
            "kernel": kernel_rows[0]["Kernel Name"][:120],
            "grid": kernel_rows[0]["Grid Size"], "block": kernel_rows[0]["Block Size"],
            "duration_us": significant(duration_ns / 1e3),
            "dram_pct": dram, "memory_pct": memory, "sm_pct": sm,
            "achieved_occupancy_pct": _number(metric.get(("Occupancy", "Achieved Occupancy"))),
            "theoretical_occupancy_pct": _number(metric.get(("Occupancy", "Theoretical Occupancy"))),
            "registers_per_thread": _number(metric.get(("Launch Statistics", "Registers Per Thread"))),
            "dram_gb": _dram_gb(metric.get((MEMORY, "Memory Throughput")), unit.get((MEMORY, "Memory Throughput")),
                                duration_ns),
            "l2_hit_pct": _number(metric.get((MEMORY, "L2 Hit Rate"))),
            "l1_hit_pct": _number(metric.get((MEMORY, "L1/TEX Hit Rate"))),
            "spilling_requests": _number(metric.get((MEMORY, "Local Memory Spilling Requests"))),
            "bound": bound_of(dram, memory, sm),
            "ncu_speed_of_light": _rule(kernel_rows, "SOLBottleneck"),
            "ncu_occupancy_limit": _rule(kernel_rows, "TheoreticalOccupancy"),
        })  # fmt: skip
    total = sum(k["duration_us"] for k in kernels)
    for k in kernels:
        k["share"] = significant(k["duration_us"] / total) if total else None
    kernels.sort(key=lambda k: -k["duration_us"])
    return {"kernels_profiled": len(kernels), "total_us": significant(total), "kernels": kernels}


# ------------------------------------------------------------------------------------------------ running ncu


CUDA_BIN = "/usr/local/cuda/bin"  # where the CUDA toolkit puts ncu when its bin/ is not on PATH


def find_ncu() -> str | None:
    """Nsight Compute's path: on PATH, else in the toolkit's bin/; None without it."""
    return shutil.which("ncu") or shutil.which("ncu", path=CUDA_BIN)


def ncu_binary() -> str:
    found = find_ncu()
    if found is None:
        raise SystemExit("Nsight Compute (`ncu`) not found. Fix: put the CUDA toolkit's bin/ on PATH, or summarise "
                         "kept CSVs with --set from_csv=DIR")  # fmt: skip
    return found


def ncu_command(ncu: str, s: Settings, probe: Probe) -> list[str]:
    config = s.embedding_bag_config if probe.bench == "embedding_bag" else s.attention_config
    spec = {"bench": probe.bench, "config": config, "case": probe.case, "step": probe.step, "calls": s.calls,
            "capture": s.capture}  # fmt: skip
    capture = ["--nvtx", "--nvtx-include", "probe/"] if s.capture == "nvtx" else ["--profile-from-start", "off"]
    sections = [arg for section in SECTIONS for arg in ("--section", section)]
    return [ncu, *capture, *sections, "--csv", "--page", "details",
            sys.executable, "-m", "benchmarks.kernels.bounds_probe", json.dumps(spec)]  # fmt: skip


def run_probe(ncu: str, s: Settings, probe: Probe, keep: Path) -> dict[str, Any]:
    """ncu over one probe; its CSV kept gzipped in `keep`; a failure recorded, not raised."""
    try:
        done = subprocess.run(ncu_command(ncu, s, probe), cwd=REPO, capture_output=True, text=True, timeout=s.timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"ncu did not finish within timeout_s={s.timeout_s}"}
    rows = read_ncu_csv(done.stdout)
    if done.returncode != 0 or not rows:
        return {"error": f"ncu exited with {done.returncode}, {len(rows)} rows: {done.stderr.strip()[-400:]}"}
    with atomic_file(keep / f"{probe.name}.csv.gz") as tmp:
        tmp.write_bytes(gzip.compress(done.stdout.encode()))
    return summarise(rows)


def kept_csv(directory: Path, name: str) -> str:
    for path, read in ((directory / f"{name}.csv", Path.read_text),
                       (directory / f"{name}.csv.gz", lambda p: gzip.decompress(p.read_bytes()).decode())):  # fmt: skip
        if path.is_file():
            return read(path)
    raise SystemExit(f"from_csv: no {name}.csv or {name}.csv.gz in {directory}. Fix: point from_csv at the folder "
                     "holding every probe's CSV")  # fmt: skip


def _headline(probe: dict[str, Any]) -> str:
    if "error" in probe:
        return str(probe["error"])
    top = probe["kernels"][0]
    return f"{top['kernel'][:40]} {top['share']:.0%} of {probe['total_us']:.0f} us, {top['bound']}"


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/kernels-bounds.yaml")
    args, reproduce, s = parse_run(parser, argv, __name__, load_settings)
    if s.from_csv is None:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: ncu profiles GPU kernels. Fix: run on the GPU machine, or summarise kept "
                             "CSVs with --set from_csv=DIR --set result_name=kernels-bounds-<gpu>")  # fmt: skip
        gpu, slug = gpu_name(torch.device("cuda"))
    elif "{device}" in s.result_name:
        raise SystemExit(
            "from_csv: the CSVs do not say which GPU made them. Fix: --set result_name=kernels-bounds-<gpu>"
        )
    else:
        gpu, slug = None, ""  # the kept CSVs' GPU: the one result_name names
    name = result_name_for(s.result_name, slug)
    keep = args.results_dir / name
    ncu = ""
    if s.from_csv is None:
        ncu = ncu_binary()
        keep.mkdir(parents=True, exist_ok=True)
    probes: dict[str, Any] = {}
    for probe in s.probes:
        if s.from_csv is None:
            probes[probe.name] = {**asdict(probe), **run_probe(ncu, s, probe, keep)}
        else:
            probes[probe.name] = {**asdict(probe), **summarise(read_ncu_csv(kept_csv(Path(s.from_csv), probe.name)))}
        logger.info("%s: %s", probe.name, _headline(probes[probe.name]))
    result = {
        "gpu": gpu,
        "notes": {
            "duration_us": "ncu's kernel duration (each kernel replayed per metric pass, clocks locked at base): "
            "longer than do_bench's; compare shares within a probe",
            "bound": f"memory / compute: that throughput >= {BOUND_AT_PCT:.0f} % of peak; latency: both below",
            "dram_gb": "bytes the kernel moved to and from DRAM (DRAM throughput x duration): against the bytes its "
            "inputs and outputs need, how often it read them again",
            "l2_hit_pct": "share of L2 requests served without DRAM (a kernel re-reading its inputs from DRAM: low)",
            "spilling_requests": "local-memory requests from registers spilled (0: none)",
        },
        "settings": asdict(s),
        "probes": probes,
        **provenance("triton"),
    }
    path = write_result(name, result, args.results_dir, reproduce)
    print(f"-> {path}")
    return path


if __name__ == "__main__":
    main()
