"""Reliability replay: every hostile input, bad file, bad config, crash and race the Hardening issue lists, against
the real processes, each recorded with its answer.

Usage:
    .venv/bin/python -m benchmarks.reliability          # ~20 min on 2 cores; needs Redis at 127.0.0.1:6379, root

Groups (one module each): `api` (requests against `recsys serve` with the in-process and the Redis store, an admin
token, a broken champion, Redis down, a flood of new users; then schemathesis with the token), `guarded` (a server
with API keys: what needs a key and that it is asked for first, a keyed client beside anonymous and keyed dashboard
readers; a domain-adapted champion's adapter files: symlink loops, another model's file, one file swapped in
repeatedly), `runtime_items` (kept files refused at start-up, adds refused with their reason, added ids through every
route after hot swaps, rollbacks, adds racing swaps, a kill -9 mid-add and a restart, a 1,000-item add under
requests, a full and a read-only disk under the kept file), `enrich` (`recsys enrich` against the tests' chat server
misbehaving in each way, altered records files, outages, bad inputs), `inputs` (bad data files through `recsys data
prepare`, bad configs and `--set` values through `recsys train`, corrupt `compare_with` evaluations through `recsys
pipeline run`), `crashes` (kill -9 mid-training then a rerun, two runs on one work dir, two runs on a fresh store, a
first model worse than popularity). Every case records what was sent, the status or exit code, whether the answer
is the expected one and its message names the problem (`clear`), whether the server answered 500 or not at all
(`server_error`), whether a traceback reached the output or the server's log (`traceback`), and whether anything was
lost or half-written (`data_lost`). Writes benchmarks/results/reliability.json with the totals and, per review, its
findings -> the cases that replay them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, settings_from
from pipelines.config import ExperimentConfig, load_config


@dataclass(frozen=True)
class Settings:
    experiment: str  # the experiment config (a path in the repo) of the champion and of the crash cases' pipelines
    experiment_overrides: dict[str, Any] = field(default_factory=dict)
    # on top of the experiment's: the content-first champion of the run-time items group (it places items by text)
    content_overrides: dict[str, Any] = field(default_factory=dict)
    crash_epochs: int = 40
    flood_users: int = 5000
    max_users: int = 1000
    reload_flood: int = 200
    fuzz_examples: int = 30
    dashboard_load_seconds: float = 10.0  # each of the three runs of the dashboard-load case

    def experiment_config(self, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
        return load_config(REPO / self.experiment, {**self.experiment_overrides, **(overrides or {})})


def load_settings(config: Path, overrides: dict[str, Any]) -> Settings:
    settings = settings_from(Settings, config, overrides)
    settings.experiment_config()  # the experiment must load
    return settings
