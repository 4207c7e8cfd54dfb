"""The `recsys` command line: data, enrich, sid, train, distill, evaluate, recommend, index, pipeline, serve, demo.

Run `recsys --help` or `recsys COMMAND --help`. Errors the user can fix exit with code 2 and a message.
"""

from __future__ import annotations

import logging
import os
import warnings

import typer

from cli import data, demo, enrich, index, models, pipeline, serve, sid
from recsys.runtime.distributed import Workers

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
app.command("distill")(models.distill_command)
app.command("evaluate")(models.evaluate_command)
app.command("recommend")(models.recommend_command)
app.command("enrich")(enrich.enrich_command)
app.command("demo")(demo.demo_command)
app.command("serve")(serve.serve_command)

OUR_PACKAGES = ("recsys", "features", "pipelines", "serving", "cli")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_DATE_FORMAT = "%H:%M:%S"
# What libraries say that users of the platform cannot act on: fbgemm's and torchrec's notes on their own modules.
UNACTIONABLE_WARNINGS = (r"fbgemm_gpu\.", r"torchrec\.")


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging, libraries' included.")) -> None:
    """Set up logging for every command: the platform's progress at INFO, the libraries' WARNING and up."""
    configure_logging(verbose)


def configure_logging(verbose: bool) -> None:
    workers = Workers.from_environment()
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        # the processes of a distributed run share a terminal: each line says whose it is
        format=LOG_FORMAT.replace("%(levelname)s", f"%(levelname)s [rank {workers.rank}]")
        if workers.distributed
        else LOG_FORMAT,
        datefmt=LOG_DATE_FORMAT,
        force=True,  # importing torchrec puts a handler on the root logger
    )
    # the platform's progress at INFO from the first process (the others do the same work), warnings from all
    progress = logging.INFO if workers.is_main else logging.WARNING
    for name in OUR_PACKAGES:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else progress)
    if not verbose:  # MLflow configures its own loggers when it is imported, after this: it reads these instead
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        for module in UNACTIONABLE_WARNINGS:
            warnings.filterwarnings("ignore", module=module)
