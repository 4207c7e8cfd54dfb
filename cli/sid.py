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
    """Prepare the config's data (skipped when up to date) and build its semantic IDs."""
    from pipelines.config import load_config
    from pipelines.content import embed_content_step
    from pipelines.data import prepare_step
    from pipelines.experiment import ExperimentPaths
    from pipelines.semantic_ids import build_semantic_ids_step
    from recsys.semantic_ids.codes import read_semantic_ids

    with handle_errors():
        cfg = load_config(config)
        if cfg.sid is None:
            raise ConfigError(f"{config} has no `sid` section. Fix: see configs/beauty-sid-rqvae.yaml")
        paths = ExperimentPaths.under(work_dir, cfg)
        data_dir = prepare_step(cfg.data, paths.data_dir)
        embeddings = embed_content_step(cfg.sid.content, data_dir, paths.content_dir, paths.cache_dir)
        path = build_semantic_ids_step(cfg.sid, data_dir, embeddings, paths.sid_dir)
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
