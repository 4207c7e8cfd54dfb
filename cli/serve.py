"""`recsys serve`: the online recommendation API (FastAPI under uvicorn)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import handle_errors


def serve_command(
    bundle: Annotated[Path | None, typer.Option("--bundle", help="A bundle directory (WORK/bundles/NAME).")] = None,
    model_name: Annotated[
        str | None, typer.Option("--model-name", help="Serve this registered model's champion instead.")
    ] = None,
    tracking_uri: Annotated[
        str, typer.Option("--tracking-uri", help="MLflow store of the registry.")
    ] = "sqlite:///mlruns.db",
    history_store: Annotated[str, typer.Option("--history-store", help="memory or redis.")] = "memory",
    redis_url: Annotated[str, typer.Option("--redis-url")] = "redis://127.0.0.1:6379/0",
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8000,
    max_batch: Annotated[
        int, typer.Option("--max-batch", min=1, help="Most recommendation requests scored in one model call.")
    ] = 64,
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log", help="Log every request (costs throughput under load).")
    ] = False,
) -> None:
    """Serve /v1/recommendations, /v1/similar-items, /v1/events, /healthz, /readyz (OpenAPI at /docs)."""
    import uvicorn
    from pydantic import ValidationError

    from recsys.errors import ConfigError
    from serving.main import create_app
    from serving.recommender import BundleError, resolve_bundle
    from serving.settings import ServingSettings

    with handle_errors():
        try:
            settings = ServingSettings(
                bundle=bundle, model_name=model_name, tracking_uri=tracking_uri,
                history_store=history_store, redis_url=redis_url, max_batch=max_batch,  # type: ignore[arg-type]
            )  # fmt: skip
            resolve_bundle(settings.bundle, settings.model_name, settings.tracking_uri)  # fail before binding the port
        except (ValidationError, BundleError) as err:
            raise ConfigError(f"{err}. Fix: see `recsys serve --help`") from err
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info", access_log=access_log)
