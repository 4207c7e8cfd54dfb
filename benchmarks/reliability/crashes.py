"""Crashes and races through the real `recsys pipeline run`: kill -9 mid-training then a rerun, two runs on one work
dir, two runs on a fresh store, and a first model worse than popularity."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.reliability.cases import RECSYS, TRACEBACK, Case, Finished, run_recsys, short
from pipelines.config import ExperimentConfig
from pipelines.train import training_state_path


def _write_config(config: ExperimentConfig, path: Path, **changes: Any) -> Path:
    """`config` as a YAML file (its name, its store under `path`'s folder), with dotted `changes`."""
    raw = config.model_dump(mode="json", exclude_none=True)
    raw["tracking"]["uri"] = f"sqlite:///{path.parent / 'mlflow.db'}"
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = raw
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return path


def _store(path: Path) -> tuple[Any, str]:
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{path.parent / 'mlflow.db'}"
    return MlflowClient(uri), uri


def _versions(path: Path, name: str) -> list[Any]:
    client, _ = _store(path)
    return list(client.search_model_versions(f"name = '{name}'"))


def _running_runs(path: Path) -> int:
    client, _ = _store(path)
    experiments = [e.experiment_id for e in client.search_experiments()]
    return len(client.search_runs(experiments, filter_string="attributes.status = 'RUNNING'"))


def _temp_leftovers(work: Path) -> list[Path]:
    return [p for p in work.rglob(".*") if ".tmp" in p.name or ".old-" in p.name]


def killed_mid_training(config: ExperimentConfig, root: Path, epochs: int) -> Case:
    """kill -9 while the model trains, then the same command again: it resumes, and nothing is left behind."""
    path = _write_config(
        config, root / "kill" / "config.yaml", **{"train.schedule.epochs": epochs, "train.schedule.patience": epochs}
    )
    work = path.parent / "work"
    state = training_state_path(work / "models" / config.name)
    command = [RECSYS, "pipeline", "run", "--config", str(path), "--work-dir", str(work)]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not state.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    killed_while_training = first.poll() is None and state.exists()
    first.send_signal(signal.SIGKILL)
    first.wait()
    running_after_kill = _running_runs(path)
    rerun = run_recsys("pipeline", "run", "--config", str(path), "--work-dir", str(work))
    versions = _versions(path, config.registered_model_name)
    leftovers = _temp_leftovers(work)
    running = _running_runs(path)
    ok = rerun.exit_code == 0 and len(versions) == 1 and not leftovers and running == 0
    return Case(
        group="crashes", name="kill -9 mid-training, then the same command",
        input=f"recsys pipeline run ({epochs} epochs), SIGKILL once the training state is saved, run again",
        expected="the rerun resumes and registers once; no temp dirs left; the killed attempt's runs not RUNNING",
        outcome=f"killed while training: {killed_while_training}; rerun exit {rerun.exit_code}; "
        f"{len(versions)} version(s); RUNNING runs {running_after_kill} -> {running}; {len(leftovers)} temp paths",
        clear=ok and killed_while_training and "resum" in rerun.output.lower(),
        server_error=False, traceback=TRACEBACK in rerun.output,
        data_lost=rerun.exit_code != 0 or bool(leftovers) or not (work / "bundles" / config.name).is_dir(),
        message=short(next((line for line in rerun.output.splitlines() if "resum" in line.lower()), rerun.output)),
    )  # fmt: skip


def two_runs_on_one_work_dir(config: ExperimentConfig, root: Path) -> Case:
    """Two `recsys pipeline run` at once on one work dir: one runs, the other says who holds it; one version."""
    path = _write_config(config, root / "race" / "config.yaml")
    work = path.parent / "work"
    runs = _together(path, work, work)
    versions = _versions(path, config.registered_model_name)
    codes = sorted(r.exit_code for r in runs)
    refused = next((r for r in runs if r.exit_code == 2), None)
    return Case(
        group="crashes", name="two runs on one work dir", input="2 x recsys pipeline run, same config and work dir",
        expected="one exits 0, the other exits 2 naming the run that holds the work dir; one version registered",
        outcome=f"exits {codes}; {len(versions)} version(s)",
        clear=codes == [0, 2] and len(versions) == 1 and refused is not None and "pid" in refused.output,
        server_error=False, traceback=any(TRACEBACK in r.output for r in runs),
        data_lost=len(versions) != 1 or bool(_temp_leftovers(work)),
        message=short(refused.output.strip().splitlines()[-1] if refused is not None else ""),
    )  # fmt: skip


def two_runs_on_a_fresh_store(config: ExperimentConfig, root: Path) -> Case:
    """Two pipelines (different work dirs) creating one new MLflow store at once: both succeed, no migration race."""
    path = _write_config(config, root / "fresh-store" / "config.yaml")
    runs = _together(path, path.parent / "work-a", path.parent / "work-b")
    versions = _versions(path, config.registered_model_name)
    codes = sorted(r.exit_code for r in runs)
    return Case(
        group="crashes", name="two runs creating one fresh store",
        input="2 x recsys pipeline run, one new SQLite store, two work dirs",
        expected="both exit 0, two versions registered", outcome=f"exits {codes}; {len(versions)} version(s)",
        clear=codes == [0, 0] and len(versions) == 2, server_error=False,
        traceback=any(TRACEBACK in r.output for r in runs), data_lost=len(versions) != 2,
        message=short(" | ".join(r.output.strip().splitlines()[-1] for r in runs if r.output.strip())),
    )  # fmt: skip


def worse_than_popularity(model_dir: Path, name: str, root: Path) -> Case:
    """The first version of a registered model scoring below the popularity baseline on validation (the trained
    model of `model_dir` with its validation NDCG@10 set under the baseline's): registered, not champion, and the
    gate says why. (An untrained SASRec can beat popularity on the synthetic data, so the score is set, not trained.)
    """
    import json
    import logging
    import shutil

    from pipelines.registry import register_bundle
    from recsys.artifacts.bundle import Bundle
    from recsys.artifacts.model_dir import METRICS_FILE, POPULARITY_VALID

    worse = root / "worse" / "model"
    shutil.copytree(model_dir, worse)
    metrics = json.loads((worse / METRICS_FILE).read_text())
    metrics["valid"]["ndcg@10"] = metrics[POPULARITY_VALID]["ndcg@10"] * 0.5
    (worse / METRICS_FILE).write_text(json.dumps(metrics))
    uri = f"sqlite:///{worse.parent / 'mlflow.db'}"
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("pipelines.registry").addHandler(handler)
    try:
        decision = register_bundle(Bundle.write(worse.parent / "bundle", name=name, model_dir=worse), name, uri)
    finally:
        logging.getLogger("pipelines.registry").removeHandler(handler)
    client, _ = _store(worse)
    versions = list(client.search_model_versions(f"name = '{name}'"))
    return Case(
        group="crashes", name="a first model worse than popularity",
        input="register_bundle of a first version whose validation NDCG@10 is half the popularity baseline's",
        expected="registered, not champion, the gate's reason and log name popularity",
        outcome=f"{len(versions)} version(s); promoted {decision.promoted}",
        clear=len(versions) == 1 and not decision.promoted and "popularity" in decision.reason
        and any("popularity" in line for line in said),
        server_error=False, traceback=False, data_lost=len(versions) != 1, message=short(decision.reason),
    )  # fmt: skip


def _together(path: Path, work_a: Path, work_b: Path) -> list[Finished]:
    """Two `recsys pipeline run` of `path` started together (work dirs `work_a`, `work_b`)."""
    start = time.perf_counter()
    processes = [
        subprocess.Popen([RECSYS, "pipeline", "run", "--config", str(path), "--work-dir", str(work)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ})
        for work in (work_a, work_b)
    ]  # fmt: skip
    outputs = [p.communicate(timeout=900)[0] for p in processes]
    seconds = time.perf_counter() - start
    return [Finished(p.returncode, out, seconds) for p, out in zip(processes, outputs, strict=True)]
