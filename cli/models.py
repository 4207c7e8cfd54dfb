"""`recsys train | distill | evaluate | recommend`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from cli.common import ConfigOpt, EpochsOpt, PreparedDirOpt, SetOpt, handle_errors, load_experiment, same_experiment
from cli.launch import MaxRestartsOpt, NprocOpt, prints_results
from cli.render import metrics_table, print_tables, recommendations_table
from pipelines.launcher import launch, needs_launch
from recsys.errors import RecsysError

if TYPE_CHECKING:  # pipelines import MLflow, which is slow: commands import them when they run
    from recsys.artifacts.model_dir import TrainedModel

ModelDirOpt = Annotated[Path, typer.Option("--model-dir", help="A model directory written by `recsys train`.")]
DataDirOpt = Annotated[
    Path | None,
    typer.Option("--data-dir", help="Prepared data directory (default: the one the model was trained on)."),
]


def train_command(
    config: ConfigOpt,
    work_dir: Annotated[
        Path,
        typer.Option("--work-dir", help="Prepared data go to WORK/data/NAME, the model to WORK/models/NAME."),
    ] = Path("runs"),
    data_dir: PreparedDirOpt = None,
    epochs: EpochsOpt = None,
    sets: SetOpt = None,
    nproc_per_node: NprocOpt = None,
    max_restarts: MaxRestartsOpt = 0,
) -> None:
    """Prepare the config's data and semantic IDs, train, pick the best epoch on validation, test (the pipeline
    until its train step: what is up to date is skipped). With --nproc-per-node N, N processes train data parallel."""
    with handle_errors():
        cfg, prepared = load_experiment(config, epochs, sets, data_dir)
        from pipelines.runner import check_run, run_pipeline  # after the config's errors
        from pipelines.steps import STEP_BEFORE_TRAINING, TRAIN_STEP

        nproc = nproc_per_node or cfg.train.distributed.nproc_per_node
        if needs_launch(nproc):
            # the data is prepared here, the train step in the processes: a missing upstream model fails before both
            check_run(cfg, until=TRAIN_STEP)
            run_pipeline(cfg, work_dir, until=STEP_BEFORE_TRAINING, data_dir=prepared)  # once, not in every process
            launch(nproc, ["train", *same_experiment(config, work_dir, data_dir, epochs, sets)], max_restarts)
        outputs, _ = run_pipeline(cfg, work_dir, until=TRAIN_STEP, data_dir=prepared)
    if not prints_results():
        return
    model = outputs.model
    assert model is not None  # the last step run
    m = model.metrics
    print_tables(metrics_table(f"{cfg.name} (best epoch {m['best_epoch']})", {"valid": m["valid"], "test": m["test"]}))
    typer.echo(f"model: {model.model_dir}   MLflow run: {model.run_id}")


def distill_command(
    config: ConfigOpt,
    teacher_dir: Annotated[
        Path | None,
        typer.Option(
            "--teacher-dir",
            help="The teacher's model directory (a two-stage or fusion model of `recsys train`); overrides the "
            "config's distill.teacher_dir.",
        ),
    ] = None,
    work_dir: Annotated[
        Path,
        typer.Option(
            "--work-dir",
            help="Prepared data go to WORK/data/NAME, the student to WORK/models/NAME (and the "
            "teacher's top-K cache beside it).",
        ),
    ] = Path("runs"),
    data_dir: PreparedDirOpt = None,
    epochs: EpochsOpt = None,
    sets: SetOpt = None,
    nproc_per_node: NprocOpt = None,
    max_restarts: MaxRestartsOpt = 0,
) -> None:
    """Train the config's model (a SASRec of the serving size) as a student of a teacher: on the teacher's top-K
    scores at every training position (KL, mixed with the cross-entropy; the config's `distill` section), then pick
    the best epoch on validation and test, as `recsys train`. The teacher's top-K are computed once and reused."""
    sets = [*(sets or []), *([f"distill.teacher_dir={teacher_dir}"] if teacher_dir is not None else [])]
    with handle_errors():
        cfg, _ = load_experiment(config, epochs, sets)  # the data is train_command's (below)
        if cfg.distill is None:
            raise RecsysError(
                f"{config} has no distill section: no teacher to learn from. Fix: pass --teacher-dir DIR (a model "
                "directory written by `recsys train`), or add `distill: {teacher_dir: DIR}` to the config"
            )
    train_command(config, work_dir, data_dir, epochs, sets, nproc_per_node, max_restarts)


def evaluate_command(
    model_dir: ModelDirOpt,
    data_dir: DataDirOpt = None,
    split: Annotated[str, typer.Option("--split", help="valid or test.")] = "test",
    exclude_seen: Annotated[bool, typer.Option("--exclude-seen", help="Mask history items before ranking.")] = False,
    users: Annotated[
        int | None,
        typer.Option(
            "--users", min=1, help="Evaluate a seeded random sample of N users only: a quick look, labelled a sample."
        ),
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", help="Seed of the --users sample: the same seed, the same users.")
    ] = None,
    item_block: Annotated[
        int | None,
        typer.Option(
            "--item-block",
            min=0,
            help="Items scored at once per user batch by models with item vectors (bounds memory); 0 = the whole "
            "catalogue; default: the protocol's (docs/training.md).",
        ),
    ] = None,
    max_seconds: Annotated[
        float | None,
        typer.Option("--max-seconds", help="Stop with an error when the evaluation runs longer (wall seconds)."),
    ] = None,
    max_memory_gb: Annotated[
        float | None,
        typer.Option(
            "--max-memory-gb", help="Stop with an error when the process's resident memory grows past this (GiB)."
        ),
    ] = None,
    compare: Annotated[
        Path | None,
        typer.Option(
            "--compare",
            help="Another model directory, evaluated the same way on the same users: prints each metric's difference "
            "(this minus other) with its 95 % interval and p-value, and writes the comparison JSON beside this model "
            "directory (NAME.vs-OTHER.SPLIT.json).",
        ),
    ] = None,
) -> None:
    """Evaluate a trained model with the full-ranking leave-one-out protocol (or, with --users, a sample of it);
    with --compare, against another model on the same users (paired bootstrap interval, randomisation p-value)."""
    from dataclasses import replace

    from recsys.artifacts.model_dir import load_model_dir
    from recsys.evaluation import EvalConfig, UserSample, evaluate

    with handle_errors():
        if split not in ("valid", "test"):
            raise RecsysError(f"--split {split!r} is not valid. Fix: use --split valid or --split test")
        if seed is not None and users is None:
            raise RecsysError("--seed picks the users of a --users sample. Fix: add --users N, or drop --seed")
        trained = load_model_dir(model_dir, data_dir)
        config = EvalConfig(exclude_seen=exclude_seen, max_seconds=max_seconds, max_memory_gb=max_memory_gb)
        config = config if item_block is None else replace(config, item_block=item_block)
        sample = None
        if users is not None:
            sample = UserSample(users) if seed is None else UserSample(users, seed)
        eval_split = trained.data.eval_split(split)
        what = f"evaluation of {model_dir} on {split}"
        result = evaluate(trained.model, eval_split, trained.data.num_items, config, sample, what=what)
        if compare is not None:
            from cli.compare import compare_models

            compare_models((model_dir, trained, result), compare, data_dir, split)
            return
    title = f"{model_dir} on {split}"
    if result.sample is not None:
        title += (
            f": SAMPLE of {len(result.ranks)} of {len(eval_split.targets)} users (seed {result.sample.seed}), "
            "not the full protocol"
        )
    print_tables(metrics_table(title, {trained.name: result.metrics}))


def recommend_command(
    model_dir: ModelDirOpt,
    user: Annotated[list[str], typer.Option("--user", help="User id (repeat for several users).")],
    k: Annotated[int, typer.Option("--k", min=1, max=1000, help="Number of items.")] = 10,
    data_dir: DataDirOpt = None,
    include_seen: Annotated[bool, typer.Option("--include-seen", help="Allow items the user already has.")] = False,
) -> None:
    """Top-k recommendations (with titles) for users, from their whole history."""
    from recsys.artifacts.model_dir import load_model_dir

    with handle_errors():
        trained = load_model_dir(model_dir, data_dir)
        for user_id in user:
            print_tables(recommendation_for(trained, user_id, k, exclude_seen=not include_seen))


def recommendation_for(
    trained: TrainedModel, user_id: str, k: int, exclude_seen: bool, shown_history: int = 5
) -> Table:
    """Table of the user's recent history and top-k recommendations."""
    import torch

    from recsys.data.jagged import Jagged
    from recsys.inference import recommend

    data, model = trained.data, trained.model
    try:
        row = data.user_row(user_id)
    except KeyError as err:
        raise RecsysError(f"{err.args[0]}. Fix: pick a user id from users.parquet of the data directory") from err
    history = data.sequences.row(row)
    users = torch.tensor([row + 1])  # user_idx of the row
    scores, items = recommend(model, Jagged.from_lists([history.tolist()]), k, exclude_seen, users)
    titles = data.titles(items[0])
    recent = data.titles(history[-shown_history:])
    return recommendations_table(
        f"user {user_id} ({len(history)} interactions, {trained.name})",
        recent,
        list(zip(titles, scores[0].tolist(), strict=True)),
    )
