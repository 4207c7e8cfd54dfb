"""What every benchmark records beside its figures: the machine, the versions and the command."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
import yaml

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line]
        cpu = names[0] if names else cpu
    info: dict[str, Any] = {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


def versions(*packages: str) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "polars", "mlflow", *packages):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["recsys_commit"] = _git_commit()
    return out


def significant(x: float, digits: int = 4) -> float:
    """`x` rounded to `digits` significant digits (CPU smoke figures are tiny, GPU ones large)."""
    return float(f"{x:.{digits}g}")


def command() -> str:
    return " ".join([Path(sys.executable).name, *sys.argv])


def write_result(name: str, result: dict[str, Any], results_dir: Path = RESULTS_DIR) -> Path:
    """Write `results_dir/<name>.json` atomically."""
    from recsys.runtime.atomic import atomic_file

    path = results_dir / f"{name}.json"
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(result, indent=2) + "\n")
    return path


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_overrides(pairs: list[str]) -> dict[str, object]:
    """`--set KEY=VALUE` pairs -> {dotted key: YAML-parsed value}."""
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--set {pair!r}: expected KEY=VALUE, e.g. --set train.epochs=40")
        out[key] = yaml.safe_load(value)
    return out
