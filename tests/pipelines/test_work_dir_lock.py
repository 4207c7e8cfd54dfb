"""One run of a pipeline per work dir at a time, and what the next run does about a killed one, with real processes
and a real MLflow SQLite store: the second run exits 2 naming the first; after a kill -9 the next run resumes the
training, marks the killed run's MLflow runs KILLED and removes the temporaries it left (only its pipeline's); two
processes can create one SQLite store at once."""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipelines.config import load_config
from pipelines.runner import run_pipeline
from recsys.runtime.lock import LockHeldError

ROOT = Path(__file__).resolve().parents[2]
RECSYS = str(Path(sys.executable).with_name("recsys"))  # the console script of this environment
TEMPORARY = re.compile(r"\.(tmp|old)-|\.tmp$")  # what the atomic writes' temporaries are called


def test_a_run_killed_during_training_holds_off_a_second_one_then_the_next_resumes_it(
    tmp_path: Path, tiny_config: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    path = tiny_config(
        tmp_path, train={"schedule": {"epochs": 12, "patience": 12}}, pipeline={"index": {"kind": "flat"}}
    )
    work = tmp_path / "work"
    command = ["pipeline", "run", "--config", str(path), "--work-dir", str(work)]
    training_state = work / "models" / "tiny-sasrec.training-state.dcp"
    with (tmp_path / "first.log").open("w") as log:
        first = subprocess.Popen([RECSYS, *command], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not training_state.exists():  # an epoch is trained and saved: the run is mid-training
            assert first.poll() is None, (tmp_path / "first.log").read_text()
            assert time.monotonic() < deadline, "no training state after 120 s"
            time.sleep(0.05)
        first.send_signal(signal.SIGSTOP)  # holds still (and holds the lock) while others try
        with pytest.raises(LockHeldError) as second:
            run_pipeline(load_config(path), work)
        waited = subprocess.run([RECSYS, *command, "--wait", "0.5"], capture_output=True, text=True, timeout=120)
    finally:
        first.kill()
        first.wait()
    held = f"pipeline tiny-sasrec under {work} is being run by pid {first.pid} on {socket.gethostname()} since "
    assert str(second.value).startswith(held) and str(second.value).endswith(
        "Fix: wait for it to finish (`--wait SECONDS` queues behind it), or use another --work-dir"
    )
    assert waited.returncode == 2 and f"error: {held}" in waited.stderr and "(waited 0.5 s)" in waited.stderr
    assert "Traceback" not in waited.stderr

    config = load_config(path)
    with caplog.at_level(logging.INFO, logger="pipelines.runner"):
        outputs, reports = run_pipeline(config, work)
    assert {r.name: r.status for r in reports}["train_retriever"] == "ran"
    assert outputs.model is not None and outputs.registration is not None
    client = MlflowClient(config.tracking.resolved_uri())
    resumed = client.get_metric_history(outputs.model.run_id, "epoch_valid_ndcg_at_10")  # type: ignore[arg-type]
    assert resumed[0].step > 1 and resumed[-1].step == 12  # it went on after the killed run's saved epoch
    experiment = client.get_experiment_by_name(config.experiment_name)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    killed = sorted(r.info.run_name for r in runs if r.info.status == "KILLED")
    assert killed == ["pipeline tiny-sasrec", "tiny-sasrec"]  # the killed pipeline run and its training run
    assert {r.info.status for r in runs} == {"KILLED", "FINISHED"}
    assert caplog.text.count("was left RUNNING by a killed process: marked KILLED") == 2
    assert f"(pipeline tiny-sasrec, pid {first.pid} on {socket.gethostname()})" in caplog.text
    versions = client.search_model_versions(f"name = '{config.registered_model_name}'")
    assert [str(v.version) for v in versions] == ["1"] and outputs.registration.decision.promoted
    assert [p for p in work.rglob(".*") if TEMPORARY.search(p.name)] == []


def test_a_run_clears_what_killed_runs_of_its_pipeline_left_and_nothing_else(
    tmp_path: Path, tiny_config: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(tiny_config(tmp_path))
    work = tmp_path / "work"
    run_pipeline(config, work, until="prepare_data")  # the experiment and the prepared data exist
    leftovers = [
        work / "models" / ".tiny-sasrec.tmp-ab12cd34",  # a model directory being written
        work / "models" / ".tiny-sasrec.training-state.dcp.tmp-ab12cd34",  # a training state being saved
        work / "models" / ".tiny-sasrec.training-state.home.dcp.tmp-ab12cd34",  # a domain adapter's
        work / "bundles" / ".tiny-sasrec.old-ab12cd34",  # a bundle being swapped out
        work / "data" / "tiny-sasrec" / ".fingerprint.json.ab12cd34.tmp",  # a file written in an output directory
        work / "models" / ".tiny-sasrec.compile-cache.bin.ab12cd34.tmp",  # a compile cache being written
        work / "pipelines" / "tiny-sasrec" / ".state.json.ab12cd34.tmp",
    ]
    others = [
        work / "models" / ".tiny-sasrec-2.tmp-ab12cd34",  # another pipeline's
        work / "cache" / "embeddings" / ".embeddings.npy.ab12cd34.tmp",  # the cache every pipeline shares
        work / "models" / ".tiny-sasrec.tmp-1",  # not a name the atomic writes make
    ]
    for leftover in leftovers[:4]:
        leftover.mkdir(parents=True)
    for other in [*leftovers[4:], *others]:
        other.parent.mkdir(parents=True, exist_ok=True)
        other.touch()

    # MLflow runs left RUNNING: by killed runs of this pipeline (here, or the lock's last holder elsewhere on a shared
    # file system), and by runs that may be alive (another host, another work dir, another pipeline)
    uri = config.tracking.resolved_uri()
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(config.experiment_name)
    assert experiment is not None
    (work / "pipelines" / "tiny-sasrec" / "lock").write_text(
        json.dumps({"pid": 7, "host": "other-host", "since": "2026-01-01T00:00:00+00:00", "token": "last"})
    )
    here, mine = socket.gethostname(), {"recsys.work_dir": str(work.resolve()), "recsys.pipeline": "tiny-sasrec"}

    def running(name: str, **tags: str) -> str:
        return str(client.create_run(experiment.experiment_id, tags=tags, run_name=name).info.run_id)

    killed_here = running("killed here", **mine, **{"recsys.host": here, "recsys.lock_token": "earlier"})
    its_step = running("its step", **{"mlflow.parentRunId": killed_here})
    killed_elsewhere = running("killed elsewhere", **mine, **{"recsys.host": "other-host", "recsys.lock_token": "last"})
    alive = {
        running("another host", **mine, **{"recsys.host": "other-host", "recsys.lock_token": "live"}),
        running("another work dir", **{**mine, "recsys.work_dir": "/elsewhere", "recsys.host": here}),
        running("another pipeline", **{**mine, "recsys.pipeline": "tiny-sasrec-2", "recsys.host": here}),
    }

    with caplog.at_level(logging.INFO, logger="pipelines.runner"):
        run_pipeline(config, work, until="prepare_data")
    assert [p for p in leftovers if p.exists()] == [] and all(p.exists() for p in others)
    removed = next(r.getMessage() for r in caplog.records if "removed what interrupted runs left" in r.getMessage())
    assert all(str(p) in removed for p in leftovers)
    status = {
        run_id: client.get_run(run_id).info.status for run_id in (killed_here, its_step, killed_elsewhere, *alive)
    }
    assert [status.pop(r) for r in (killed_here, its_step, killed_elsewhere)] == ["KILLED"] * 3
    assert set(status.values()) == {"RUNNING"}


CREATE_STORE = """
import sys, time
from pathlib import Path
from pipelines.tracking import TrackingSection
from pipelines.tracking import start_tracking
folder, uri, name = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
(folder / name).touch()
while not (folder / "go").exists():
    time.sleep(0.01)
with start_tracking(TrackingSection(uri=uri), "concurrent", name):
    pass
"""


def test_two_processes_create_one_sqlite_store_at_once(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    names = ["first", "second"]
    processes = [
        subprocess.Popen([sys.executable, "-c", CREATE_STORE, str(tmp_path), uri, name], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name in names
    ]  # fmt: skip
    deadline = time.monotonic() + 120
    while not all((tmp_path / name).exists() for name in names):  # both imported, neither has touched the store
        assert time.monotonic() < deadline and all(p.poll() is None for p in processes)
        time.sleep(0.05)
    (tmp_path / "go").touch()
    outputs = [p.communicate(timeout=120)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], outputs  # without the store's lock: alembic errors
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("concurrent")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert sorted((r.info.run_name, r.info.status) for r in runs) == [("first", "FINISHED"), ("second", "FINISHED")]
