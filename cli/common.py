"""Helpers shared by the CLI commands."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from recsys.errors import RecsysError

if TYPE_CHECKING:  # pipelines import MLflow, which is slow: commands import them when they run
    from pipelines.config import ExperimentConfig

ERROR_EXIT_CODE = 2

ConfigOpt = Annotated[Path, typer.Option("--config", help="Experiment YAML, e.g. configs/synthetic/sasrec.yaml.")]
EpochsOpt = Annotated[int | None, typer.Option("--epochs", min=1, help="Override train.schedule.epochs.")]
PreparedDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="The data: a prepared directory (`recsys data prepare`'s) is used as it is; any other file or directory "
        "is the raw input of the config's data.source (= --set data.path=...), prepared under the work dir.",
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override a config key (dotted, YAML value; repeatable), e.g. --set "
        "train.optimization.lr=3e-4 --set model.params.dim=128.",
    ),
]


@contextmanager
def handle_errors() -> Iterator[None]:
    """Turn a `RecsysError` into "error: <message>" on stderr and exit code 2; other errors propagate.

    Example:
        >>> with handle_errors():
        ...     pass
    """
    try:
        yield
    except RecsysError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(ERROR_EXIT_CODE) from err


def same_experiment(
    config: Path, work_dir: Path, data_dir: Path | None, epochs: int | None, sets: list[str] | None
) -> list[str]:
    """The options that give another process this command's experiment (for the processes of a distributed run).

    Example:
        >>> same_experiment(Path("c.yaml"), Path("runs"), None, 3, ["train.optimization.lr=1e-3"])
        ['--config', 'c.yaml', '--work-dir', 'runs', '--epochs', '3', '--set', 'train.optimization.lr=1e-3']
    """
    options = ["--config", str(config), "--work-dir", str(work_dir)]
    options += ["--data-dir", str(data_dir)] if data_dir is not None else []
    options += ["--epochs", str(epochs)] if epochs is not None else []
    return options + [item for value in sets or [] for item in ("--set", value)]


def load_experiment(
    config: Path, epochs: int | None, sets: list[str] | None, data_dir: Path | None = None
) -> tuple[ExperimentConfig, Path | None]:
    """The experiment config with the command line's overrides (--set, then --epochs) applied, and the prepared
    directory to use (None: the pipeline prepares the config's data). A `data_dir` that is not a prepared directory
    is the raw input of the config's source: it becomes `data.path`, said on stderr."""
    from pipelines.config import load_config, parse_overrides
    from recsys.data.schema import META_FILE

    overrides = parse_overrides(sets or [])
    if epochs is not None:
        overrides["train.schedule.epochs"] = epochs
    if data_dir is not None and not (data_dir / META_FILE).is_file():
        overrides["data.path"] = str(data_dir)
        typer.echo(f"--data-dir {data_dir} is not a prepared directory (no {META_FILE}): read as the raw input of the "
                   "config's data.source, prepared under the work dir", err=True)  # fmt: skip
        data_dir = None
    return load_config(config, overrides), data_dir
