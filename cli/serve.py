"""`recsys serve`: the online recommendation API (FastAPI under uvicorn), in one process or `--workers N`.

Every option defaults to "not given": only what is given on the command line reaches `ServingSettings`, so the
`RECSYS_*` environment variables (docs/serving.md) set the rest. The options given are handed to the server
through those same variables, so one process and N workers (each building the app from the environment) are
configured alike. The admin token has no option: a secret on a command line is visible to every user of the
machine (`ps`); it comes from RECSYS_ADMIN_TOKEN or `--admin-token-file`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import handle_errors

ENV_PREFIX = "RECSYS_"
SECRET_SETTINGS = ("admin_token",)  # environment only (see the module docstring)


def _setting(flag: str, description: str) -> Any:
    """An option of a `ServingSettings` field: not given by default, so its RECSYS_ variable (named in the help)
    applies; the settings check its value."""
    return typer.Option(flag, help=f"{description} (env: {_variable(flag.removeprefix('--').replace('-', '_'))})")


def _variable(setting: str) -> str:
    return ENV_PREFIX + setting.upper()


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
    history_store: Annotated[
        str | None, _setting("--history-store", "memory (default) or redis (needed for --workers > 1).")
    ] = None,
    redis_url: Annotated[str | None, _setting("--redis-url", "Default redis://127.0.0.1:6379/0.")] = None,
    max_batch: Annotated[
        int | None,
        _setting("--max-batch", "Requests scored in one model call, at most (default 64)."),
    ] = None,
    events_per_user: Annotated[
        int | None, _setting("--events-per-user", "Online events kept per user (default 50).")
    ] = None,
    max_users: Annotated[
        int | None, _setting("--max-users", "Users the in-process store keeps, least recently active dropped first.")
    ] = None,
    history_ttl_s: Annotated[
        int | None, _setting("--history-ttl-s", "Seconds a user's events live in Redis (default 30 days).")
    ] = None,
    reload_interval_s: Annotated[
        float | None,
        _setting("--reload-interval-s", "Seconds between champion checks (default 30; 0 = never)."),
    ] = None,
    reload_min_interval_s: Annotated[
        float | None,
        _setting("--reload-min-interval-s", "An admin reload sooner after the last check gets 429 (default 5)."),
    ] = None,
    torch_threads: Annotated[
        int | None,
        _setting("--torch-threads", "Threads per model call (default 1: other cores serve HTTP)."),
    ] = None,
    admin_token_file: Annotated[
        Path | None,
        _setting("--admin-token-file", "File holding the admin bearer token; no token = no admin routes."),
    ] = None,
    api_keys_file: Annotated[
        Path | None, _setting("--api-keys-file", "File of API keys (one per line) the /v1 routes require.")
    ] = None,
    refusal_delay_s: Annotated[
        float | None,
        _setting("--refusal-delay-s", "Seconds a request without a valid API key waits for its 401/403 (default 0.5)."),
    ] = None,
    adapter_root: Annotated[
        Path | None, _setting("--adapter-root", "The only directory adapters are swapped in from.")
    ] = None,
    added_items_file: Annotated[
        Path | None,
        _setting("--added-items-file", "Where items added at run time (POST /v1/admin/items) are kept; unset: off."),
    ] = None,
    max_added_items: Annotated[
        int | None, _setting("--max-added-items", "The most run-time items kept (default 10,000).")
    ] = None,
    max_body_bytes: Annotated[
        int | None, _setting("--max-body-bytes", "Larger request bodies get 413 (default 1 MiB).")
    ] = None,
    dashboard_ttl_s: Annotated[
        float | None,
        _setting(
            "--dashboard-ttl-s",
            "Seconds a rendered /dashboard page is reused when the store is not a SQLite file (default 30).",
        ),
    ] = None,
    workers: Annotated[
        int | None, _setting("--workers", "Server processes (default 1); more need --history-store redis.")
    ] = None,
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8000,
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log", help="Log every request (costs throughput under load).")
    ] = False,
) -> None:
    """Serve /v1/recommendations, /v1/similar-items, /v1/events, /healthz, /readyz, /metrics (OpenAPI at /docs),
    and /v1/admin/* when an admin token is set."""
    import uvicorn
    from pydantic import ValidationError

    from pipelines.registry import resolve_bundle
    from recsys.errors import ConfigError
    from recsys.runtime.validation import problems
    from serving.settings import ServingSettings

    options = dict(locals())  # the settings' options are named after their fields
    given = {key: value for key, value in options.items() if key in ServingSettings.model_fields and value is not None}
    with handle_errors():
        try:
            settings = ServingSettings(**given)
        except ValidationError as err:
            raise ConfigError(f"{problems(err)}. Fix: see `recsys serve --help` and docs/serving.md") from err
        resolve_bundle(settings.bundle, settings.model_name, settings.registry_uri)  # fail before binding the port
    os.environ.update({_variable(key): str(value) for key, value in given.items()})
    uvicorn.run(
        "serving.main:create_app_from_environment", factory=True, workers=settings.workers, host=host, port=port,
        log_level="info", access_log=access_log, log_config=_logging_config(),
    )  # fmt: skip


def _logging_config() -> dict[str, Any]:
    """uvicorn's logging plus the platform's loggers at this command's level: uvicorn applies it in every worker
    process, which would otherwise start with Python's defaults (nothing below WARNING)."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    from cli import LOG_DATE_FORMAT, LOG_FORMAT, OUR_PACKAGES

    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"]["recsys"] = {"format": LOG_FORMAT, "datefmt": LOG_DATE_FORMAT}
    config["handlers"]["recsys"] = {
        "class": "logging.StreamHandler",
        "formatter": "recsys",
        "stream": "ext://sys.stderr",
    }
    level = logging.getLevelName(logging.getLogger(OUR_PACKAGES[0]).getEffectiveLevel())
    for name in OUR_PACKAGES:
        config["loggers"][name] = {"handlers": ["recsys"], "level": level, "propagate": False}
    return config
