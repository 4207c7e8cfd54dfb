"""The dashboard over scheduled runs: the daily pipeline run `runs` times on the synthetic data with a drifting
training seed, tracked in one MLflow store with the registry's champion gate; then the dashboard read from that store
(its trend, its champion vs challenger view), rendered, and drawn by headless Chromium.

Usage:
    .venv/bin/python -m benchmarks.dashboard_trend
    .venv/bin/python -m benchmarks.dashboard_trend --set runs=3 --set work_dir=/tmp/trend

Settings: benchmarks/configs/dashboard-trend.yaml (`--config`, `--set KEY=VALUE`). Run i trains `experiment` with
train.seed = `first_seed` + i (what changes from one scheduled run to the next when the data stays), under one work
directory, so each run is a new version of the same registered model, gated against the champion. A run already
done in the work directory is skipped by the pipeline (its steps are up to date). Writes `work_dir`/dashboard.html
and dashboard.png (a 1200 x `screenshot_height` screenshot), and benchmarks/results/dashboard-trend.json: the
gate's decision for every run, the comparison's headline difference, and the seconds to read the store and to
render the page.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from pipelines.config import load_config
from pipelines.runner import run_pipeline
from recsys.dashboard import from_mlflow, render_dashboard
from recsys.runtime.atomic import atomic_file

logger = logging.getLogger("benchmarks.dashboard_trend")

CHROMIUM_HINT = "apt-get install -y chromium"


@dataclass(frozen=True)
class Settings:
    experiment: str = "configs/synthetic/sasrec.yaml"
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted keys of `experiment`, for every run
    runs: int = 5
    first_seed: int = 0
    work_dir: str = ".cache/dashboard-trend"
    screenshot_height: int = 2400


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/dashboard-trend.yaml")
    args, reproduce, s = parse_run(parser, argv, __name__, load_settings)
    work = Path(s.work_dir)
    uri = f"sqlite:///{(work / 'mlflow.db').resolve()}"
    decisions = []
    for run in range(s.runs):
        seed = s.first_seed + run
        config = load_config(REPO / s.experiment, {**s.overrides, "train.seed": seed, "tracking.uri": uri,
                                                   "train.progress": False})  # fmt: skip
        outputs, _ = run_pipeline(config, work)
        decision = None if outputs.registration is None else outputs.registration.decision
        decisions.append({"seed": seed, "promoted": None if decision is None else decision.promoted,
                          "reason": None if decision is None else decision.reason})  # fmt: skip
        logger.info("scheduled run %d of %d (train.seed %d): %s", run + 1, s.runs, seed, decisions[-1]["reason"])
    start = time.perf_counter()
    data = from_mlflow(uri)
    read_seconds = time.perf_counter() - start
    start = time.perf_counter()
    page = render_dashboard(data)
    render_seconds = time.perf_counter() - start
    html_path = work / "dashboard.html"
    with atomic_file(html_path) as tmp:
        tmp.write_text(page)
    screenshot = _screenshot(html_path, work / "dashboard.png", s.screenshot_height)
    comparison = data.comparison
    result = {
        "settings": asdict(s),
        "runs": decisions,
        "trend_points": len(data.trend),
        "promoted": sum(bool(point.promoted) for point in data.trend),
        "comparison": None if comparison is None else {
            "challenger": comparison["challenger"], "champion": comparison["champion"], "users": comparison["users"],
            "overall": comparison["overall"],
        },
        "notes": data.notes,
        "read_seconds": significant(read_seconds),
        "render_seconds": significant(render_seconds),
        "page_bytes": len(page.encode()),
        "dashboard": str(html_path),
        "screenshot": None if screenshot is None else str(screenshot),
        **provenance(),
    }  # fmt: skip
    path = write_result("dashboard-trend", result, args.results_dir, reproduce)
    print(f"{len(data.trend)} evaluations, {result['promoted']} promoted; page {html_path}, screenshot {screenshot}")
    print(f"-> {path}")
    return path


def _screenshot(html_path: Path, png_path: Path, height: int) -> Path | None:
    """`html_path` drawn by headless Chromium into `png_path` (1200 px wide); None, with a warning saying how to
    install it, when there is no Chromium."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        logger.warning("no chromium: the dashboard is written, its screenshot is not. Fix: %s", CHROMIUM_HINT)
        return None
    with tempfile.TemporaryDirectory(prefix="recsys-chromium-") as profile:
        command = [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
            f"--window-size=1200,{height}", "--virtual-time-budget=10000", f"--screenshot={png_path.resolve()}",
            html_path.resolve().as_uri(),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    if done.returncode != 0:
        raise SystemExit(f"chromium could not draw {html_path} (exit {done.returncode}): {done.stderr[-2000:]}")
    return png_path


if __name__ == "__main__":
    main()
