"""`recsys sid build`: content embeddings -> RQ-VAE / RQ-KMeans -> semantic_ids.parquet, with health stats."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cli.common import handle_errors
from recsys.errors import ConfigError

app = typer.Typer(help="Semantic IDs of a catalog.", no_args_is_help=True)


@app.command("build")
def build_command(
    config: Annotated[Path, typer.Option("--config", help="Experiment YAML with a `sid` section.")],
    work_dir: Annotated[Path, typer.Option("--work-dir", help="Outputs go to WORK/sids/NAME.")] = Path("runs"),
) -> None:
    """Prepare the config's data, embed its items' text and build its semantic IDs (the pipeline until its semantic-ID
    step: what is up to date is skipped)."""
    from pipelines.config import load_config

    with handle_errors():
        cfg = load_config(config)
        if cfg.sid is None:
            raise ConfigError(f"{config} has no `sid` section. Fix: see configs/beauty/sid-rqvae.yaml")
        from pipelines.runner import run_pipeline  # after the config: its errors come before MLflow's import
        from recsys.semantic_ids.codes import read_semantic_ids

        outputs, _ = run_pipeline(cfg, work_dir, until="build_semantic_ids")
        assert outputs.semantic_ids is not None  # the config has a `sid` section
        path = outputs.semantic_ids.path
        _, stats = read_semantic_ids(path)
    table = Table(title=f"semantic-ID health ({cfg.sid.method}, {cfg.sid.vectors} vectors)")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for key, value in stats.to_dict().items():
        table.add_row(key, _fmt(value))
    Console().print(table)
    typer.echo(f"wrote {path}")


def _fmt(value: object) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(_fmt(v) for v in value)
    return f"{value:.4f}" if isinstance(value, float) else str(value)
