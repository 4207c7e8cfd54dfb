"""`recsys serve`: the online recommendation API (FastAPI under uvicorn).

Every option defaults to "not given": only what is given on the command line reaches `ServingSettings`, so the
`RECSYS_*` environment variables (docs/serving.md) set the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import handle_errors


def _setting(flag: str, description: str) -> Any:
    """An option of a `ServingSettings` field: not given by default, so its RECSYS_ variable (named in the help)
    applies; the settings check its value."""
    env = "RECSYS_" + flag.removeprefix("--").replace("-", "_").upper()
    return typer.Option(flag, help=f"{description} (env: {env})")


def serve_command(
    bundle: Annotated[Path | None, _setting("--bundle", "A bundle directory (WORK/bundles/NAME).")] = None,
    model_name: Annotated[
        str | None, _setting("--model-name", "Serve this registered model's champion instead.")
    ] = None,
    tracking_uri: Annotated[
        str | None,
        _setting(
            "--tracking-uri", "The registry's MLflow store (default $MLFLOW_TRACKING_URI, else sqlite:///mlruns.db)."
        ),
    ] = None,
    history_store: Annotated[str | None, _setting("--history-store", "memory (default) or redis.")] = None,
    redis_url: Annotated[str | None, _setting("--redis-url", "Default redis://127.0.0.1:6379/0.")] = None,
    max_batch: Annotated[
        int | None,
        _setting("--max-batch", "Requests scored in one model call, at most (default 64)."),
    ] = None,
    events_per_user: Annotated[
        int | None, _setting("--events-per-user", "Online events kept per user (default 50).")
    ] = None,
    reload_interval_s: Annotated[
        float | None,
        _setting("--reload-interval-s", "Seconds between champion checks (default 30; 0 = never)."),
    ] = None,
    torch_threads: Annotated[
        int | None,
        _setting("--torch-threads", "Threads per model call (default 1: other cores serve HTTP)."),
    ] = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8000,
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log", help="Log every request (costs throughput under load).")
    ] = False,
) -> None:
    """Serve /v1/recommendations, /v1/similar-items, /v1/events, /healthz, /readyz (OpenAPI at /docs)."""
    import uvicorn
    from pydantic import ValidationError

    from pipelines.registry import resolve_bundle
    from recsys.errors import ConfigError
    from serving.main import create_app
    from serving.settings import ServingSettings

    given: dict[str, Any] = {
        "bundle": bundle, "model_name": model_name, "tracking_uri": tracking_uri, "history_store": history_store,
        "redis_url": redis_url, "max_batch": max_batch, "events_per_user": events_per_user,
        "reload_interval_s": reload_interval_s, "torch_threads": torch_threads,
    }  # fmt: skip
    with handle_errors():
        try:
            settings = ServingSettings(**{key: value for key, value in given.items() if value is not None})
        except ValidationError as err:
            raise ConfigError(f"{err}. Fix: see `recsys serve --help`") from err
        resolve_bundle(settings.bundle, settings.model_name, settings.registry_uri)  # fail before binding the port
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info", access_log=access_log)
