"""`recsys serve`: the online recommendation API (FastAPI under uvicorn), in one process or `--workers N`.

Its options are made from `serving.settings.ServingSettings`, one per field (the field's description is its help):
every option defaults to "not given", so only what is given on the command line reaches the settings and the
`RECSYS_*` environment variables (docs/serving.md) set the rest. The options given are handed to the server through
those same variables, so one process and N workers (each building the app from the environment) are configured alike.
Secrets have no option: a secret on a command line is visible to every user of the machine (`ps`); the admin token
comes from RECSYS_ADMIN_TOKEN or `--admin-token-file`.
"""

from __future__ import annotations

import inspect
import logging
import os
import types
from typing import Annotated, Any, Literal, get_args, get_origin

import typer
from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from cli.common import handle_errors
from recsys.errors import MissingExtra
from recsys.runtime.extras import optional

ENV_PREFIX = "RECSYS_"


def _settings_fields() -> dict[str, FieldInfo]:
    """The serving settings' fields that are options (secrets are the environment's alone); `MissingExtra` without the
    serving extra."""
    for module in ("fastapi", "uvicorn", "pydantic_settings"):
        optional(module, extra="serve", feature="`recsys serve`")
    from serving.settings import ServingSettings

    return {name: f for name, f in ServingSettings.model_fields.items() if SecretStr not in _types_of(f.annotation)}


def _types_of(annotation: Any) -> tuple[Any, ...]:
    """The types an annotation admits (`Path | None` -> (Path, NoneType))."""
    return get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)


def _option_type(annotation: Any) -> Any:
    """The type typer parses an option of a field as (a Literal's values are checked by the settings)."""
    kind = next(t for t in _types_of(annotation) if t is not type(None))
    return str if get_origin(kind) is Literal else kind


def _variable(setting: str) -> str:
    return ENV_PREFIX + setting.upper()


def _setting_parameters() -> list[inspect.Parameter]:
    """One keyword parameter per settings field: `--model-name` for `model_name`, its help the field's description,
    the variable that sets it otherwise and its default."""
    parameters = []
    for name, field in _settings_fields().items():
        default = "" if field.default in (None, PydanticUndefined) else f"; default {field.default}"
        help_text = f"{field.description} (env: {_variable(name)}{default})"
        option = typer.Option(f"--{name.replace('_', '-')}", help=help_text, show_default=False)
        annotation = Annotated[_option_type(field.annotation) | None, option]  # type: ignore[valid-type]
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation))
    return parameters


def serve_command(
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8000,
    access_log: Annotated[
        bool, typer.Option("--access-log/--no-access-log", help="Log every request (costs throughput under load).")
    ] = False,
    **settings_given: Any,
) -> None:
    """Serve /v1/recommendations, /v1/similar-items, /v1/events, /healthz, /readyz, /metrics (OpenAPI at /docs),
    /dashboard, and /v1/admin/* when an admin token is set."""
    from pydantic import ValidationError

    from recsys.errors import ConfigError
    from recsys.runtime.validation import problems

    given = {key: value for key, value in settings_given.items() if value is not None}
    with handle_errors():
        _settings_fields()  # the serving extra is installed
        import uvicorn

        from serving.loading import check_before_serving
        from serving.settings import ServingSettings

        try:
            settings = ServingSettings(**given)
        except ValidationError as err:
            said = problems(err)
            fix = "" if "Fix: " in said else ". Fix: see `recsys serve --help` and docs/serving.md"
            raise ConfigError(f"{said}{fix}") from err
        check_before_serving(settings)  # fail before binding the port
    os.environ.update({_variable(key): str(value) for key, value in given.items()})
    uvicorn.run(
        "serving.main:create_app_from_environment", factory=True, workers=settings.workers, host=host, port=port,
        log_level="info", access_log=access_log, log_config=_logging_config(),
    )  # fmt: skip


def _with_setting_options() -> None:
    """Give `serve_command` one option per settings field: typer reads the options off its signature. Without the
    serving extra it keeps its fixed options, and says which extra to install when run."""
    fixed = [p for p in inspect.signature(serve_command).parameters.values() if p.kind is not p.VAR_KEYWORD]
    try:
        options = _setting_parameters()
    except MissingExtra:
        options = []
    serve_command.__signature__ = inspect.Signature([*fixed, *options])  # type: ignore[attr-defined]


_with_setting_options()


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
