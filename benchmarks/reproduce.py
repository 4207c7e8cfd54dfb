"""Every result's provenance: the command that reproduces it, and a check that no result lacks one.

Usage:
    .venv/bin/python -m benchmarks.reproduce benchmarks/results/beauty-sasrec.json   # prints its command
    .venv/bin/python -m benchmarks.reproduce --check                                 # exit 1 if any result fails

A result passes the check when its `reproduce` record names a benchmark module, a config file in the repo and
overrides that the module loads (`load_settings`), and, for benchmarks that can tell (`recorded_mismatches`), when
the settings the result records are those of that config with those overrides. A record of before a config key or
path was renamed is read under today's names (`benchmarks.moved`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, RESULTS_DIR, Reproduce
from benchmarks.moved import current_record


def jsonable(tree: Any) -> Any:
    """`tree` as a result's JSON holds it (tuples as lists), to compare settings with what a result recorded."""
    return json.loads(json.dumps(tree))


def field_defaults(cls: type) -> dict[str, Any]:
    """The fields of a settings dataclass that have a default, each as a result records it: what a result written
    before the field existed is read as having (for a benchmark's `recorded_mismatches`)."""
    return {f.name: jsonable(f.default) for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def mismatches(recorded: dict[str, Any], expected: dict[str, Any]) -> Iterator[str]:
    """For a benchmark's `recorded_mismatches`: one line per key whose recorded value differs from the expected one
    ("<absent>" where a side lacks it)."""
    for key in sorted(recorded.keys() | expected.keys()):
        have, want = recorded.get(key, "<absent>"), expected.get(key, "<absent>")
        if have != want:
            yield f"{key}: the result has {have!r}, the config {want!r}"


def problems_of(path: Path) -> list[str]:
    """What keeps the result at `path` from being reproduced by a config in the repo (nothing: [])."""
    result = json.loads(path.read_text())
    record = result.get("reproduce")
    if not isinstance(record, dict) or set(record) != {"benchmark", "config", "overrides"}:
        return ["no `reproduce` record {benchmark, config, overrides}"]
    record = current_record(record)
    try:
        module = importlib.import_module(record["benchmark"])
    except ImportError as err:
        return [f"benchmark {record['benchmark']!r} cannot be imported ({err})"]
    config = REPO / record["config"]
    if not config.is_file():
        return [f"config {record['config']} is not in the repo"]
    try:
        settings = module.load_settings(config, record["overrides"])
    except Exception as err:  # any failure to load is the finding
        return [f"{record['config']} with {record['overrides']} does not load: {err}"]
    check = getattr(module, "recorded_mismatches", None)
    return [] if check is None else list(check(result, settings))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="*", type=Path, help="result JSONs whose commands to print")
    parser.add_argument("--check", action="store_true", help=f"check every JSON under {RESULTS_DIR.relative_to(REPO)}")
    args = parser.parse_args(argv)
    if not args.check:
        for path in args.results:
            record = json.loads(path.read_text()).get("reproduce")
            print(f"{path}: {Reproduce(**current_record(record)).command() if record else 'no reproduce record'}")
        return 0
    failed = 0
    paths = sorted(RESULTS_DIR.rglob("*.json"))
    for path in paths:
        problems = problems_of(path)
        if problems:
            failed += 1
            print(f"{path.relative_to(REPO)}: " + "; ".join(problems))
    print(f"{len(paths) - failed} of {len(paths)} results reproduce from a config in the repo; {failed} fail the check")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
