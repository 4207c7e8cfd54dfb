"""What every benchmark shares: its command line (a config in the repo, `--set` overrides, where results go) and what
it records beside its figures (the machine, the versions, and how to reproduce the result).

Every benchmark module defines `load_settings(config, overrides)`: its settings from a YAML file in the repo (an
experiment config: a product one of configs/ or an experiment of the laboratory's benchmarks/configs/<dataset>/, or a
benchmark's settings, benchmarks/configs/<name>.yaml) and dotted overrides. Every result it writes
carries `reproduce` = {benchmark, config, overrides}: `python -m benchmarks.reproduce` turns that back into the
command, and `--check` holds every result to it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import torch
import yaml

from pipelines.config import parse_overrides, read_config_tree, set_dotted
from recsys.errors import ConfigError
from recsys.runtime.atomic import atomic_file
from recsys.runtime.validation import config_from

RESULTS_DIR = Path(__file__).resolve().parent / "results"
RESULT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
REPO = RESULTS_DIR.parents[1]
T = TypeVar("T")


@dataclass(frozen=True)
class Reproduce:
    """How a result was made: the benchmark module, its config (a path in the repo) and the overrides on it."""

    benchmark: str  # e.g. "benchmarks.quality"
    config: str  # e.g. "configs/beauty/sasrec.yaml"
    overrides: dict[str, Any]

    def arguments(self) -> list[str]:
        """The benchmark's command-line arguments: --config and one --set per override."""
        sets = [arg for key, value in self.overrides.items() for arg in ("--set", f"{key}={_yaml_value(value)}")]
        return ["--config", self.config, *sets]

    def command(self) -> str:
        return f".venv/bin/python -m {self.benchmark} {shlex.join(self.arguments())}"


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so that a wall-clock interval covers it."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def benchmark_parser(doc: str, default_config: str | None = None) -> argparse.ArgumentParser:
    """The command line of a benchmark described by `doc` (its module docstring): --config, --set, --results-dir."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    add_config_arguments(parser, default_config)
    return parser


def parse_run(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    module: str,
    load_settings: Callable[[Path, dict[str, Any]], T],
) -> tuple[argparse.Namespace, Reproduce, T]:
    """Parse a benchmark's command line, put the platform's logs on the console, and load the settings it names:
    (args, its `reproduce` record, the settings of the config with the overrides)."""
    args = parser.parse_args(argv)
    log_to_console()
    reproduce = reproduce_of(module, args)
    return args, reproduce, load_settings(args.config, reproduce.overrides)


def log_to_console() -> None:
    """The platform's INFO logs on the console (`force`: importing torchrec already put a handler on the root)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)


def add_config_arguments(parser: argparse.ArgumentParser, default_config: str | None = None) -> None:
    """--config (a YAML file in the repo), --set KEY=VALUE (repeatable) and --results-dir."""
    parser.add_argument(
        "--config",
        type=Path,
        required=default_config is None,
        default=None if default_config is None else Path(default_config),
        help=f"the benchmark's config, a YAML file in the repo (default {default_config})",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (YAML value), e.g. --set train.epochs=40",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")


def reproduce_of(module: str, args: argparse.Namespace, given: dict[str, Any] | None = None) -> Reproduce:
    """The `reproduce` record of a run of the benchmark `module` (its `__name__`) with the parsed `args` (--config,
    --set) and the overrides its own options gave (`given`, before the --set ones); a config outside the repo is
    refused (no config, no result)."""
    benchmark = sys.modules["__main__"].__spec__.name if module == "__main__" else module  # type: ignore[union-attr]
    config: Path = args.config
    try:
        overrides = {**(given or {}), **parse_overrides(args.set)}
    except ConfigError as err:
        raise SystemExit(str(err)) from err
    resolved = config.resolve()
    if not resolved.is_relative_to(REPO) or not resolved.is_file():
        raise SystemExit(
            f"--config {config} is not a file in the repo ({REPO}). Fix: a result must come from a config in the repo "
            "(configs/ or benchmarks/configs/), with --set for what differs"
        )
    return Reproduce(benchmark, resolved.relative_to(REPO).as_posix(), overrides)


def settings_from(cls: type[T], config: Path, overrides: dict[str, Any]) -> T:
    """A benchmark's settings dataclass from its YAML `config` (`base:` and header comments as in experiment
    configs) with dotted `overrides`; unknown keys are refused by name."""
    raw = read_config_tree(config)
    raw.pop("name", None)
    for dotted, value in overrides.items():
        set_dotted(raw, dotted, value)
    return config_from(cls, raw, "")


INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"  # where inductor keeps what it compiled (read at each compilation)


def child_report(reproduce: Reproduce, arguments: list[str], timeout_s: float) -> dict[str, Any]:
    """Run the benchmark of `reproduce` again, with its config and overrides plus `arguments` and `--child-report
    PATH`, in a new process whose inductor cache is empty; the JSON object the child wrote to PATH."""
    with tempfile.TemporaryDirectory(prefix="inductor-") as inductor, tempfile.TemporaryDirectory() as out:
        report = Path(out) / "report.json"
        command = [sys.executable, "-m", reproduce.benchmark, *reproduce.arguments(), *arguments,
                   "--child-report", str(report)]  # fmt: skip
        env = {**os.environ, INDUCTOR_CACHE: inductor}
        subprocess.run(command, env=env, cwd=REPO, check=True, timeout=timeout_s)
        return dict(json.loads(report.read_text()))


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """The median wall time of `repeats` calls of `fn`, after one untimed warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def wait_until_ok(url: str, timeout_s: float, alive: Callable[[], bool] = lambda: True) -> bool:
    """Poll `GET url` until it answers 200 (True), or until `timeout_s` passes or `alive()` turns False (False): a
    server process starting."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    return False


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
    """The command line as run (beside `reproduce`, which gives it in the repo's terms)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    program = ["-m", spec.name] if spec is not None else [sys.argv[0]]
    return " ".join([Path(sys.executable).name, *program, *sys.argv[1:]])


def provenance(*packages: str) -> dict[str, Any]:
    """What every result records about where it was made: the machine, the versions (+ `packages`'), the command."""
    return {"machine": machine(), "versions": versions(*packages), "command": command()}


def result_name_for(template: str, device: str) -> str:
    """A result's name from a `result_name` setting: `{device}` (where it stands) replaced by the device's short name
    (`gpu_name`'s: h100, cpu). SystemExit for any other field in braces or a name that is not a plain file name (a
    benchmark calls it, or `check_result_template`, before its run)."""
    try:
        name = template.format(device=device)
    except (KeyError, IndexError, ValueError) as err:
        raise SystemExit(f"result_name {template!r}: only {{device}} may stand in braces ({err!r}). Fix: e.g. "
                         "--set result_name=kernels-hstu-attention-{device}-long") from None  # fmt: skip
    check_result_name(name)
    return name


def check_result_template(template: str) -> None:
    """SystemExit now for a `result_name` setting that could not name a result (`result_name_for`'s rules): a
    benchmark that learns its device's name late checks it before its run, not after."""
    result_name_for(template, "gpu")


def check_result_name(name: str) -> None:
    """SystemExit unless `name` is a plain file name (letters, digits, `.`, `_`, `-`): it names a file of the results
    folder, never a path."""
    if not RESULT_NAME.fullmatch(name):
        raise SystemExit(f"result name {name!r}: use letters, digits, '.', '_' and '-' only, starting with a letter or "
                         "digit (it names benchmarks/results/<name>.json; --results-dir says where)")  # fmt: skip


def write_result(name: str, result: dict[str, Any], results_dir: Path, reproduce: Reproduce) -> Path:
    """Write `results_dir/<name>.json` atomically, headed by its name and date, with how to reproduce it."""
    check_result_name(name)
    path = results_dir / f"{name}.json"
    head = {"name": name, "date": datetime.now(UTC).isoformat(timespec="seconds")}
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps({**head, **result, "reproduce": asdict(reproduce)}, indent=2) + "\n")
    return path


def _yaml_value(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return text.removesuffix("\n...").removesuffix(" ...")


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
        return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
