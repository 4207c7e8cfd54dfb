"""Every step of the platform at every size: wall and CPU time, peak RSS, disk, and each cost's growth exponent; JSON,
and the markdown table of docs/scale.md.

Usage:
    .venv/bin/python -m benchmarks.scale                           # the grid of benchmarks/configs/scale.yaml
    .venv/bin/python -m benchmarks.scale --config benchmarks/configs/scale-smoke.yaml
    .venv/bin/python -m benchmarks.scale --table benchmarks/results/scale-cpu2.json      # a result as a table

Settings: benchmarks/configs/scale.yaml (`--config`, `--set KEY=VALUE`): the sizes (users x items of the synthetic
data) and the steps, each a command template run at each size in a process group of its own, through
`benchmarks.child_rusage`, so that the peak RSS its `wait4` reports (ru_maxrss: the command and the processes it waited
for) is the step's alone. Per step and size: the status, the wall and CPU seconds, the peak RSS and the size of what it
wrote (its `output`). A step still running at its budget is killed and recorded "over_budget"; one that exits non-zero
"failed", with the end of its log; one above its `max_users`, without a command yet, or whose `needs` did not succeed
at that size "skipped", with the reason. None of them gets a figure. A cost's growth exponent is the least-squares
slope of log(cost) against log(interactions) over the sizes where the step succeeded (the interactions of a size: what
its prepare kept, from meta.json). Writes benchmarks/results/scale-<label>.json after each size (`sizes_done`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import REPO, benchmark_parser, parse_run, provenance, settings_from, significant, write_result
from benchmarks.reproduce import jsonable, mismatches

logger = logging.getLogger(__name__)

PLACEHOLDERS = ("python", "recsys", "data_dir", "work_dir", "num_users", "num_items")
METRICS = ("wall_s", "cpu_s", "peak_rss_gib", "disk_gib")  # each gets a growth exponent
OK, OVER_BUDGET, FAILED, SKIPPED = "ok", "over_budget", "failed", "skipped"
LOG_TAIL_LINES = 3  # of a failed step's log, into its record


@dataclass(frozen=True)
class Size:
    users: int
    items: int

    @property
    def name(self) -> str:
        return f"u{self.users}-i{self.items}"


@dataclass(frozen=True)
class Step:
    """One step: a command template (`PLACEHOLDERS` in braces) run at every size.

    Args:
        command: the template, e.g. "{recsys} data prepare --source synthetic ... --out {data_dir}"; None: not built
            yet (recorded as skipped, with `note`).
        budget_s: wall seconds before the step is killed (over_budget).
        output: the template of the path it writes, whose size is its disk figure; None: no disk figure.
        needs: steps that must have succeeded at the size first (e.g. a prepare before what reads its data).
        max_users: the largest number of users it runs at on the machine the config is for; None: every size.
        note: why (the limit, or what a step without a command waits for).
    """

    command: str | None
    budget_s: float = 600.0
    output: str | None = None
    needs: tuple[str, ...] = ()
    max_users: int | None = None
    note: str = ""

    def __post_init__(self) -> None:
        for key, template in (("command", self.command), ("output", self.output)):
            unknown = sorted({name for name in _placeholders(template or "") if name not in PLACEHOLDERS})
            if unknown:
                raise ValueError(f"{key}: unknown placeholder(s) {unknown} in {template!r}; known: {PLACEHOLDERS}")
        if self.command is not None and not self.command.strip():
            raise ValueError("command: empty; give a command template, or null for a step not built yet")
        if self.budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {self.budget_s}")


@dataclass(frozen=True)
class Settings:
    sizes: tuple[Size, ...]
    steps: dict[str, Step]  # run in this order at each size
    label: str | None = None  # the result is scale-<label>.json; None: the machine (cpu<cores> or the GPU's name)
    work_root: str | None = None  # where the steps write (a fresh directory in it per run); None: the system's temp
    keep_work: bool = False  # keep what the steps wrote (by default each size's files go once its steps are done)

    def __post_init__(self) -> None:
        names = list(self.steps)
        for index, (name, step) in enumerate(self.steps.items()):
            for need in step.needs:
                if need not in names[:index]:
                    raise ValueError(f"steps: {name} needs {need!r}, which is not a step before it ({names[:index]})")


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    return settings_from(Settings, config, overrides)


def recorded_mismatches(result: dict[str, Any], settings: Settings) -> Iterator[str]:
    """The settings the result records (sizes, steps and their commands, ...) that differ from the config's."""
    return mismatches(result.get("settings", {}), jsonable(asdict(settings)))


@dataclass(frozen=True)
class Place:
    """Where the steps of one size run: `work_dir` holds all they write; the prepared data go to `data_dir`."""

    size: Size
    work_dir: Path

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    def fill(self, template: str, *, quote: bool = True) -> str:
        """`template` with the placeholders filled in, the paths quoted for a command line (`quote`) or not."""
        recsys = Path(sys.executable).with_name("recsys")  # the console script of the same environment
        paths = {"python": sys.executable, "recsys": recsys, "data_dir": self.data_dir, "work_dir": self.work_dir}
        filled = {key: shlex.quote(str(value)) if quote else str(value) for key, value in paths.items()}
        return template.format(**filled, num_users=self.size.users, num_items=self.size.items)


@dataclass(frozen=True)
class Measured:
    """A step's run: its exit code (None: killed at the budget) and, if it ran to its end, what `wait4` said of it."""

    returncode: int | None
    figures: dict[str, float]  # wall_s, cpu_s, peak_rss_gib; empty if it did not run to its end


def run_measured(command: str, budget_s: float, log: Path) -> Measured:
    """Run `command` (no shell) through `benchmarks.child_rusage` (which says why) in a new process group, the output
    into `log`; kill the group at `budget_s`, and once the command ends too, so that nothing it left running (a
    server) outlives the step."""
    rusage = log.with_suffix(".rusage.json")
    launcher = [sys.executable, "-m", "benchmarks.child_rusage", str(rusage), *shlex.split(command)]
    killed = threading.Event()

    def kill_at_budget() -> None:
        killed.set()
        _kill_group(group.pid)

    with log.open("wb") as out:
        group = subprocess.Popen(launcher, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        timer = threading.Timer(budget_s, kill_at_budget)
        timer.start()
        try:
            group.wait()
        finally:
            timer.cancel()
            _kill_group(group.pid)
    if killed.is_set():
        return Measured(None, {})
    if not rusage.is_file():  # the launcher failed before the command ended (it says why in the log)
        return Measured(group.returncode, {})
    ran = json.loads(rusage.read_text())
    figures = {"wall_s": ran["wall_s"], "cpu_s": ran["cpu_s"], "peak_rss_gib": ran["peak_rss_kib"] / 2**20}
    return Measured(ran["returncode"], figures)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group has ended
        os.killpg(pid, signal.SIGKILL)


def run_step(name: str, step: Step, place: Place, done: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The record of `step` at `place`'s size: status, figures (None unless ok) and a note; `done`: the records of
    the steps before it at this size."""
    record: dict[str, Any] = {"status": SKIPPED, **dict.fromkeys(METRICS), "note": step.note}
    failed_need = next((need for need in step.needs if done[need]["status"] != OK), None)
    if step.command is None:
        record["note"] = step.note or "no command yet"
    elif step.max_users is not None and place.size.users > step.max_users:
        record["note"] = f"above this step's max_users ({step.max_users:,}): {step.note}".removesuffix(": ")
    elif failed_need is not None:
        record["note"] = f"needs {failed_need}, which was {done[failed_need]['status']} at this size"
    else:
        command = place.fill(step.command)
        logger.info("%s at %s: %s", name, place.size.name, command)
        log = place.work_dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        record.update(_outcome(run_measured(command, step.budget_s, log), step, place, log))
    logger.info("%s at %s: %s", name, place.size.name, record)
    return record


def _outcome(measured: Measured, step: Step, place: Place, log: Path) -> dict[str, Any]:
    if measured.returncode is None:
        return {"status": OVER_BUDGET, "note": f"killed at its budget of {step.budget_s:g} s"}
    if measured.returncode != 0:
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-LOG_TAIL_LINES:]
        return {"status": FAILED, "note": f"exit code {measured.returncode}: " + " | ".join(tail)[-600:]}
    disk = None if step.output is None else _tree_bytes(Path(place.fill(step.output, quote=False))) / 2**30
    figures = {key: significant(value) for key, value in measured.figures.items()}
    return {"status": OK, **figures, "disk_gib": None if disk is None else significant(disk), "note": ""}


def growth_exponent(sizes: list[float], costs: list[float]) -> float | None:
    """The least-squares slope of log(cost) against log(size): cost ~ size^k. None without two distinct sizes.

    Example:
        >>> growth_exponent([1e6, 1e7, 1e8], [2.0 * n**1.5 for n in (1e6, 1e7, 1e8)])
        1.5
    """
    if len(set(sizes)) < 2:
        return None
    slope = np.polyfit(np.log(sizes), np.log(costs), 1)[0]
    return round(float(slope), 3)


def exponents(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each metric's growth exponent over the runs that succeeded at a size of known interactions."""
    fitted = {}
    for metric in METRICS:
        points = [(r["interactions"], r[metric]) for r in runs if r["status"] == OK and r["interactions"] and r[metric]]
        fitted[metric] = growth_exponent([n for n, _ in points], [c for _, c in points])
    return fitted


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/scale.yaml")
    parser.add_argument("--table", type=Path, help="print the markdown table of this result JSON and run nothing")
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    if args.table is not None:
        print(render(json.loads(args.table.read_text())))
        return args.table
    if settings.work_root is not None:
        Path(settings.work_root).mkdir(parents=True, exist_ok=True)
    run_root = Path(tempfile.mkdtemp(prefix="recsys-scale-", dir=settings.work_root))
    logger.info("the steps write under %s", run_root)
    name = f"scale-{settings.label or machine_label()}"
    runs: dict[str, list[dict[str, Any]]] = {step: [] for step in settings.steps}
    try:
        for done, size in enumerate(settings.sizes, start=1):
            for step, record in run_size(settings, Place(size, run_root / size.name)).items():
                runs[step].append(record)
            steps = {step: {"runs": step_runs, "exponents": exponents(step_runs)} for step, step_runs in runs.items()}
            result = {"settings": asdict(settings), "sizes_done": f"{done} of {len(settings.sizes)}", "steps": steps,
                      **({"work_dir": str(run_root)} if settings.keep_work else {}), **provenance()}  # fmt: skip
            path = write_result(name, result, args.results_dir, reproduce)  # after each size: a long run killed late
    finally:
        if not settings.keep_work:
            shutil.rmtree(run_root, ignore_errors=True)
    print(render(json.loads(path.read_text())), f"-> {path}", sep="\n")
    return path


def run_size(settings: Settings, place: Place) -> dict[str, dict[str, Any]]:
    """Every step's record at `place`'s size, with the size and its interactions; its files go after, unless kept."""
    done: dict[str, dict[str, Any]] = {}
    for name, step in settings.steps.items():
        done[name] = run_step(name, step, place, done)
    size = {"users": place.size.users, "items": place.size.items, "interactions": _interactions(place.data_dir)}
    if not settings.keep_work:
        shutil.rmtree(place.work_dir, ignore_errors=True)
    return {name: {**size, **record} for name, record in done.items()}


def _interactions(data_dir: Path) -> int | None:
    """The interactions the size's prepare kept (its meta.json); None where it did not finish."""
    meta = data_dir / "meta.json"
    return int(json.loads(meta.read_text())["counts"]["interactions"]) if meta.is_file() else None


def machine_label() -> str:
    """cpu<cores>, or the GPU's name in lower case with dashes (e.g. nvidia-h100-80gb-hbm3)."""
    if torch.cuda.is_available():
        return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name().lower()).strip("-")
    return f"cpu{os.cpu_count()}"


def render(result: dict[str, Any]) -> str:
    """A result of this benchmark as two markdown tables: every step at every size, then the growth exponents."""
    lines = [
        "| step | users | items | interactions | status | wall | CPU | peak RSS | disk |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for name, step in result["steps"].items():
        for run in step["runs"]:
            status = run["status"] if not run["note"] else f"{run['status']}: {run['note']}"
            figures = [_unit(run["wall_s"], "s"), _unit(run["cpu_s"], "s"), _unit(run["peak_rss_gib"], "GiB"),
                       _unit(run["disk_gib"], "GiB")]  # fmt: skip
            counts = [f"{run[key]:,}" if run[key] is not None else "—" for key in ("users", "items", "interactions")]
            lines.append(f"| {name} | {' | '.join(counts)} | {status} | {' | '.join(figures)} |")
    lines += ["", "| step | " + " | ".join(f"{m} exponent" for m in METRICS) + " |", "|---|" + "---:|" * len(METRICS)]
    for name, step in result["steps"].items():
        fitted = [_unit(step["exponents"][metric], "") for metric in METRICS]
        lines.append(f"| {name} | {' | '.join(fitted)} |")
    return "\n".join(lines)


def _unit(value: float | None, unit: str) -> str:
    return "—" if value is None else f"{value:g} {unit}".strip()


def _tree_bytes(path: Path) -> int:
    """The bytes of the files at `path` (a file, or a directory and everything under it); 0 if it is missing."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _placeholders(template: str) -> list[str]:
    return [match.group(1) for match in re.finditer(r"\{(\w+)\}", template)]


if __name__ == "__main__":
    main()
