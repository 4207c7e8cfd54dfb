"""The `recsys` command line: data, sid, train, evaluate, recommend, index, pipeline, serve, demo.

Run `recsys --help` or `recsys COMMAND --help`. Errors the user can fix exit with code 2 and a message.
"""

from __future__ import annotations

import logging

import typer

from cli import data, demo, index, models, pipeline, serve, sid

app = typer.Typer(
    help="Recommender platform: prepare data, train, evaluate and recommend.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(data.app, name="data")
app.add_typer(sid.app, name="sid")
app.add_typer(index.app, name="index")
app.add_typer(pipeline.app, name="pipeline")
app.command("train")(models.train_command)
app.command("evaluate")(models.evaluate_command)
app.command("recommend")(models.recommend_command)
app.command("demo")(demo.demo_command)
app.command("serve")(serve.serve_command)


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging.")) -> None:
    """Set up logging for every command."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,  # importing torchrec puts a WARNING-level handler on the root logger
    )
    for noisy in ("alembic", "mlflow", "urllib3", "git", "faiss.loader"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
