"""`recsys pipeline run`: the platform's steps in order, up-to-date ones skipped, resumable after a crash."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cli.common import ConfigOpt, EpochsOpt, PreparedDirOpt, SetOpt, handle_errors, load_experiment, same_experiment
from cli.launch import MaxRestartsOpt, NprocOpt, prints_results
from pipelines.launcher import launch, needs_launch

app = typer.Typer(
    help="Training pipelines (prepare -> semantic IDs -> train -> index -> evaluate -> register).", no_args_is_help=True
)


@app.command("run")
def run_command(
    config: ConfigOpt,
    work_dir: Annotated[Path, typer.Option("--work-dir", help="Every step's outputs go under WORK.")] = Path("runs"),
    data_dir: PreparedDirOpt = None,
    epochs: EpochsOpt = None,
    sets: SetOpt = None,
    step: Annotated[
        str | None, typer.Option("--step", help="Run only this step (the ones before it must be up to date).")
    ] = None,
    until: Annotated[str | None, typer.Option("--until", help="Stop after this step.")] = None,
    rerun: Annotated[
        list[str] | None,
        typer.Option(
            "--rerun", metavar="STEP", help="Run this step from scratch even when it is up to date (repeatable)."
        ),
    ] = None,
    wait: Annotated[
        float,
        typer.Option(
            "--wait",
            metavar="SECONDS",
            min=0,
            help="If another process is running this pipeline under WORK, wait up to SECONDS for it to finish "
            "(default: exit at once with code 2, naming it).",
        ),
    ] = 0.0,
    nproc_per_node: NprocOpt = None,
    max_restarts: MaxRestartsOpt = 0,
) -> None:
    """Run the config's pipeline; steps whose inputs did not change are skipped (the steps: docs/pipelines.md). With
    --nproc-per-node N, its train step runs on N processes."""
    with handle_errors():
        cfg, prepared = load_experiment(
            config, epochs, sets, data_dir
        )  # before the runner's imports: a config error comes at once
        from pipelines.runner import run_pipeline, runs_step
        from pipelines.steps import STEP_BEFORE_TRAINING, TRAIN_STEP

        rerun = rerun or []
        nproc = nproc_per_node or cfg.train.distributed.nproc_per_node
        if needs_launch(nproc) and runs_step(TRAIN_STEP, step, until):
            if step is None:  # the steps before training, once, in this process
                run_pipeline(cfg, work_dir, until=STEP_BEFORE_TRAINING, data_dir=prepared, rerun=rerun, wait_s=wait)
            train = [
                "--step" if step else "--until",
                TRAIN_STEP,
                *(["--rerun", TRAIN_STEP] if TRAIN_STEP in rerun else []),
            ]
            experiment = same_experiment(config, work_dir, data_dir, epochs, sets)
            launch(nproc, ["pipeline", "run", *experiment, *train], max_restarts)
            rerun = [name for name in rerun if name != TRAIN_STEP]  # the processes did: what is left reads their model
        _, reports = run_pipeline(cfg, work_dir, only=step, until=until, data_dir=prepared, rerun=rerun, wait_s=wait)
    if not prints_results():
        return
    table = Table(title=f"pipeline {cfg.name}")
    for column in ("step", "status", "seconds", "outputs"):
        table.add_column(column)
    for r in reports:
        shown = {} if r.outputs is None else r.outputs.summary()
        table.add_row(r.name, r.status, f"{r.seconds:.1f}", ", ".join(f"{k}={_short(v)}" for k, v in shown.items()))
    Console(width=200).print(table)


def _short(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
