"""`recsys demo`: the main job on the embedded synthetic data, end to end, in about a minute or two.

Prepare the synthetic data -> train popularity and SASRec (tracked in MLflow) -> print the test
metrics side by side -> print top-10 recommendations with titles for three users.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from recsys.cli.common import handle_errors
from recsys.cli.models import recommendation_for
from recsys.cli.render import metrics_table, print_tables

DEFAULT_CONFIG = Path("configs/synthetic-sasrec.yaml")


def demo_command(
    out: Annotated[Path, typer.Option("--out", help="Working directory (data, models, MLflow store).")] = Path(".demo"),
    config: Annotated[
        Path, typer.Option("--config", help="Experiment config of the sequential model.")
    ] = DEFAULT_CONFIG,
    num_users: Annotated[int, typer.Option("--show-users", help="Users to show recommendations for.")] = 3,
) -> None:
    """Train and evaluate popularity and SASRec on the synthetic data; show recommendations."""
    from pipelines.config import load_config
    from pipelines.data import prepare_step
    from pipelines.model_dir import load_model_dir
    from pipelines.train import train_step

    with handle_errors():
        out = out.resolve()
        tracking = {"tracking.uri": f"sqlite:///{out / 'mlflow.db'}"}
        sequential = load_config(config, tracking)
        data_dir = prepare_step(sequential.data, out / "data" / sequential.name)
        popularity = load_config(config, {**tracking, "model": {"name": "popularity"}, "name": "popularity"})
        rows = {}
        for cfg in (popularity, sequential):
            typer.echo(f"training {cfg.model.name} ...")
            outputs = train_step(cfg, data_dir, out / "models" / cfg.model.name)
            rows[cfg.model.name] = {
                **outputs.metrics["test"],
                "train_seconds": outputs.metrics["train_seconds"],
            }
        trained = load_model_dir(out / "models" / sequential.model.name)
        user_ids = trained.data.users["user_id"].head(num_users).to_list()
        tables = [recommendation_for(trained, user_id, k=10, exclude_seen=True) for user_id in user_ids]
    print_tables(metrics_table("test metrics (leave-one-out, full ranking)", rows, extra=("train_seconds",)), *tables)
    uri = tracking["tracking.uri"]
    typer.echo(f"MLflow store: {uri}  (browse it: .venv/bin/mlflow ui --backend-store-uri {uri})")
