"""The tests a GPU changes, in one command, each listed with its result: those marked `gpu` (they need CUDA and skip
with a reason elsewhere) and those marked `kernels` (Triton and fused kernels, run natively on a GPU and in Triton's
interpreter on a CPU).

Usage:
    .venv/bin/python -m benchmarks.gpu_tests                     # benchmarks/configs/gpu-tests.yaml
    # on the air-gapped GPU machine, after ../shared/tools/gpu-kit.sh's parts a and b are installed in /tmp/site:
    #   here:  make gpu-test-kit                                  (pytest and Hypothesis wheels in .whl/t)
    #   there: python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/t/*.whl
    #          PYTHONPATH=/tmp/site:$PWD python3 -m benchmarks.gpu_tests --results-dir $OUT

    # a suite longer than one device call (600 s there): its parts, one call each, then gathered into one result
    #   there: python3 -m benchmarks.gpu_tests --set "part=[K, 3]" --results-dir $OUT     (K = 1, 2, 3)
    #   here:  .venv/bin/python -m benchmarks.gpu_tests --set gather=3 --set "result_name=gpu-tests-h100"
    # or, on a host of N GPUs, the N parts at once (one process each, on its own GPU), gathered by the same command:
    #   there: python3 -m benchmarks.gpu_tests --side-by-side 4 --results-dir $OUT

Settings: benchmarks/configs/gpu-tests.yaml (`--config`, `--set KEY=VALUE`): `markers` (a pytest -m expression),
`paths`, `timeout_s` (the run's limit: past it pytest is interrupted, the tests that finished are listed and the
result says it stopped), `part` ([K, N]: the K-th of N disjoint parts of the selected tests), `balance_from` (a result
of this benchmark: its tests' seconds balance the parts, longest first into the part with the least so far, a test it
lacks counted at their median; none: every N-th of the sorted ids), `gather` (N: run nothing, merge the N parts'
results into one).
Writes benchmarks/results/<result_name>.json ({device}: the GPU's short name, or cpu; a part's name ends in
-part-K-of-N): every selected test's id, outcome (passed, failed, error, skipped), seconds and, where it did not
pass, pytest's message; the counts per outcome; `seconds`, the tests' own (setup, call and teardown) summed;
`wall_seconds`, the run's from start to end (gathered: from the first part's start to the last part's end, which is
less than their sum when parts ran side by side; null when a part's result does not say); pytest's exit code.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from pydantic import PositiveInt

from benchmarks.common import (
    REPO,
    benchmark_parser,
    check_result_template,
    parse_run,
    provenance,
    result_name_for,
    settings_from,
    significant,
    write_result,
)
from benchmarks.kernels.embedding_bag import gpu_name
from benchmarks.pytest_outcomes import read_outcomes
from benchmarks.side_by_side import Unit, run_side_by_side, visible_gpus
from recsys.errors import ConfigError

logger = logging.getLogger("benchmarks.gpu_tests")

# pytest's exit codes that still mean every selected test ran (1: some failed; 5: none selected)
RAN_TO_THE_END = {0, 1, 5}


# how long an interrupted pytest may take to stop before it is killed (each finished test is already in the log)
STOP_GRACE_S = 20


@dataclass(frozen=True)
class Settings:
    markers: str = "gpu or kernels"
    paths: tuple[str, ...] = ("tests/recsys", "tests/benchmarks")
    timeout_s: PositiveInt = 540
    part: tuple[PositiveInt, PositiveInt] | None = None
    balance_from: str | None = None  # a result of this benchmark (a path in the repo) whose seconds balance the parts
    gather: PositiveInt | None = None
    result_name: str = "gpu-tests-{device}"

    def __post_init__(self) -> None:
        if self.part is not None and not self.part[0] <= self.part[1]:
            raise ConfigError(f"part: {list(self.part)} names part K of N with K > N. Fix: K in 1..N, e.g. [1, 3]")
        if self.part is not None and self.gather is not None:
            raise ConfigError("part and gather: a run either runs one part or gathers the parts. Fix: set one")


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    settings = settings_from(Settings, config, overrides)
    if settings.balance_from is not None:
        recorded_seconds(settings.balance_from)  # a missing or unreadable result fails here, before any test runs
    return settings


def recorded_seconds(result: str) -> dict[str, float]:
    """Each test's seconds in `result` (a path in the repo, a result of this benchmark), by its id from the repo."""
    path = REPO / result
    try:
        tests = json.loads(path.read_text())["tests"]
        return {test["id"]: float(test["seconds"]) for test in tests}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(
            f"balance_from: {result} is not a result of this benchmark with its tests' seconds ({err!r}). "
            "Fix: name one in benchmarks/results (e.g. gpu-tests-h200.json), or drop balance_from"
        ) from err


def balanced_part(ids: list[str], part: int, parts: int, seconds: dict[str, float]) -> list[str]:
    """The `part`-th (1-based) of `parts` disjoint parts of `ids` (collected ids, each with its file's absolute path)
    of near-equal recorded `seconds` (ids from the repo): longest first into the part with the least so far, ties
    to the lower part; a test without a record counts as their median. The same on every call, sorted."""
    known = sorted(seconds.values())
    typical = known[len(known) // 2] if known else 1.0
    root = str(REPO.resolve()) + "/"
    cost = {test: seconds.get(test.removeprefix(root), typical) for test in ids}
    loads, members = [0.0] * parts, [[] for _ in range(parts)]
    for test in sorted(ids, key=lambda test: (-cost[test], test)):
        lightest = loads.index(min(loads))
        loads[lightest] += cost[test]
        members[lightest].append(test)
    return sorted(members[part - 1])


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(__doc__, "benchmarks/configs/gpu-tests.yaml")
    parser.add_argument(
        "--side-by-side",
        type=int,
        default=1,
        metavar="N",
        help="run the tests as N parts in N processes at once (on a host of several GPUs each on the one running the "
        "fewest), each part's result written as `part` writes it, then gather them into one result (default: "
        "%(default)s, all in one process)",
    )
    args, reproduce, settings = parse_run(parser, argv, __name__, load_settings)
    check_result_template(settings.result_name)
    if args.side_by_side < 1:
        raise ConfigError(f"--side-by-side {args.side_by_side}: give 1 or more processes")
    if args.side_by_side > 1:
        if settings.part is not None or settings.gather is not None:
            raise ConfigError("--side-by-side N runs and gathers N parts of its own. Fix: drop part and gather")
        own = sys.argv[1:] if argv is None else argv  # each part's own options come after, and win
        command = [sys.executable, "-m", reproduce.benchmark, *own]
        name = run_parts_side_by_side(settings, args.side_by_side, command, args.results_dir)
        out = gathered(replace(settings, gather=args.side_by_side, result_name=name), args.results_dir)
    elif settings.gather is not None:
        out = gathered(settings, args.results_dir)
        name = settings.result_name
    else:
        out, slug = run_part(settings)
        name = result_name_for(settings.result_name, slug)
        if settings.part is not None:
            name += "-part-{}-of-{}".format(*settings.part)
    path = write_result(name, out, args.results_dir, reproduce)
    for test in out["tests"]:
        if test["outcome"] != "passed":
            print(f"{test['outcome']:8} {test['id']}: {test.get('message', '')[:200]}")
    print(f"{out['counts']} on {out['device']}, ran to the end: {out['ran_to_the_end']} -> {path}")
    return path


def run_part(settings: Settings) -> tuple[dict[str, Any], str]:
    """The selected tests (or settings.part of them) run in one pytest child process, each with its result; and the
    device's short name."""
    gpu, slug = gpu_name(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    started = time.time()  # the wall clock: parts run in other processes, or calls, are gathered on it
    deadline = time.monotonic() + settings.timeout_s  # the collection of a part counts too
    selection = list(settings.paths)
    if settings.part is not None:
        part, parts = settings.part
        collected = collect(settings)
        if settings.balance_from is None:
            selection = collected[part - 1 :: parts]
        else:
            selection = balanced_part(collected, part, parts, recorded_seconds(settings.balance_from))
        logger.info("part %d of %d: %d tests", part, parts, len(selection))
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "outcomes.jsonl"
        exit_code = run_pytest(settings, selection, log, deadline - time.monotonic() - STOP_GRACE_S) if selection else 5
        tests = read_outcomes(log)
    out = {
        "settings": asdict(settings),
        "device": gpu,
        "pytest_exit_code": exit_code,
        "ran_to_the_end": exit_code in RAN_TO_THE_END,
        **_summary(tests),
        "started_unix_s": round(started, 3),
        "wall_seconds": significant(time.time() - started),
        **provenance("triton", "pytest", "hypothesis"),
    }
    return out, slug


def run_parts_side_by_side(settings: Settings, parts: int, command: list[str], results_dir: Path) -> str:
    """`command` (this benchmark's, as given) for each of `parts` parts at once, its result in `results_dir`, its log
    in a folder of its own under the system's temporary one (named when a part fails); the parts' result name."""
    logs = Path(tempfile.mkdtemp(prefix="gpu-tests-"))
    units = [
        Unit(f"part {part} of {parts}",
             [*command, "--set", f"part=[{part}, {parts}]", "--side-by-side", "1", "--results-dir", str(results_dir)],
             logs / f"part-{part}-of-{parts}.log")
        for part in range(1, parts + 1)
    ]  # fmt: skip
    run_side_by_side(units, parts, visible_gpus() if torch.cuda.is_available() else ())
    # the device's name once the parts are done: this process holds no GPU while they run
    slug = gpu_name(torch.device("cuda" if torch.cuda.is_available() else "cpu"))[1]
    return result_name_for(settings.result_name, slug)


def gathered(settings: Settings, results_dir: Path) -> dict[str, Any]:
    """The results of parts 1..settings.gather (`<result_name>-part-K-of-N.json` in `results_dir`) as one: every
    test once, and the whole ran to the end only if every part did."""
    assert settings.gather is not None
    parts = []
    for part in range(1, settings.gather + 1):
        path = results_dir / f"{settings.result_name}-part-{part}-of-{settings.gather}.json"
        if not path.is_file():
            raise ConfigError(
                f"{path} is missing: gather={settings.gather} needs every part's result. Fix: run the part there "
                f'(--set "part=[{part}, {settings.gather}]") and copy its JSON here, or gather fewer parts'
            )
        parts.append(json.loads(path.read_text()))
    devices = {part["device"] for part in parts}
    if len(devices) != 1:
        raise ConfigError(f"the parts ran on different devices ({sorted(devices)}): gather the parts of one machine")
    tests = [test for part in parts for test in part["tests"]]
    return {
        "settings": asdict(settings),
        "device": devices.pop(),
        "parts": [
            {
                "name": part["name"],
                "pytest_exit_code": part["pytest_exit_code"],
                "commit": part["versions"]["recsys_commit"],
            }
            for part in parts
        ],
        "ran_to_the_end": all(part["ran_to_the_end"] for part in parts),
        **_summary(tests),
        "wall_seconds": _wall_seconds(parts),
        "versions": parts[0]["versions"],
        "machine": parts[0]["machine"],
    }


def _wall_seconds(parts: list[dict[str, Any]]) -> float | None:
    """From the first part's start to the last part's end; None when a part's result does not say (older ones)."""
    if not all("started_unix_s" in part for part in parts):
        return None
    ends = [part["started_unix_s"] + part["wall_seconds"] for part in parts]
    return significant(max(ends) - min(part["started_unix_s"] for part in parts))


def _summary(tests: list[dict[str, Any]]) -> dict[str, Any]:
    counts = Counter(test["outcome"] for test in tests)
    return {
        "counts": dict(sorted(counts.items())),
        "seconds": significant(sum(test["seconds"] for test in tests)),
        "tests": tests,
    }


def collect(settings: Settings) -> list[str]:
    """The sorted ids of the tests `settings` selects, each with its file's absolute path (pytest's collection alone,
    in a child process, rooted at / so that the ids name their files wherever the paths are)."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "--rootdir=/",
               "-m", settings.markers, *settings.paths]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=os.environ.copy(), capture_output=True, text=True,
                          timeout=settings.timeout_s)  # fmt: skip
    if done.returncode not in RAN_TO_THE_END:
        raise RuntimeError(f"collecting the tests failed (pytest exit code {done.returncode}):\n{done.stdout[-4000:]}")
    return sorted("/" + line for line in done.stdout.splitlines() if "::" in line and not line.startswith(" "))


def run_pytest(settings: Settings, selection: list[str], log: Path, timeout_s: float) -> int:
    """pytest on `selection` (paths or test ids) in a child process (its own interpreter: the kernels' environment is
    read at import), each test's outcome appended to `log` as it finishes (`benchmarks.pytest_outcomes`); its exit
    code, or -1 past `timeout_s`: then pytest is interrupted (SIGINT), and killed if it does not stop."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "benchmarks.pytest_outcomes",
               f"--outcomes-log={log}", "-m", settings.markers, *selection]  # fmt: skip
    logger.info("running %s", " ".join(command[:12]) + (" ..." if len(command) > 12 else ""))
    with subprocess.Popen(command, cwd=REPO, env=os.environ.copy()) as child:
        try:
            return child.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            logger.error("the tests ran past timeout_s (%d s) and were interrupted: the result lists those that "
                         "finished", settings.timeout_s)  # fmt: skip
            child.send_signal(signal.SIGINT)
            try:
                child.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
            return -1


if __name__ == "__main__":
    main()
