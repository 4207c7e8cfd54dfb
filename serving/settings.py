"""Settings of the online API, from the environment (prefix RECSYS_) or passed to `create_app`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from recsys.artifacts.added_items import AddedItemStore
from recsys.artifacts.registry import resolve_tracking_uri, sqlite_path

MIN_TOKEN_CHARS = 16  # shorter admin tokens are refused: guessable


class ServingSettings(BaseSettings):
    """Which bundle to serve, where user histories live, and who may call what: each field is the RECSYS_ variable of
    its name (RECSYS_MODEL_NAME, ...) and an option of `recsys serve` (`--model-name`, ...); the descriptions below are
    both's help (docs/serving.md)."""

    model_config = SettingsConfigDict(env_prefix="RECSYS_", env_ignore_empty=True, frozen=True)

    bundle: Path | None = Field(
        default=None, description="A bundle directory (WORK/bundles/NAME); unset: the registered model's champion."
    )
    model_name: str | None = Field(
        default=None, description="Serve this registered model's champion (when no bundle is given)."
    )
    tracking_uri: str | None = Field(
        default=None,
        description="The MLflow store of that registry and of the dashboard's runs (default: $MLFLOW_TRACKING_URI, "
        "else runs/mlflow.db, the store of the default --work-dir runs). A SQLite store must exist: serving never "
        "creates one.",
    )
    history_store: Literal["memory", "redis"] = Field(
        default="memory",
        description="Where users' online events live: in-process, or Redis (shared by workers and replicas).",
    )
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0", description="The Redis server of the redis history store."
    )
    events_per_user: int = Field(default=50, ge=1, le=10_000, description="Most recent online events kept per user.")
    max_users: int = Field(
        default=100_000,
        ge=1,
        description="Users whose events the in-process store keeps, the least recently active dropped first.",
    )
    history_ttl_s: int = Field(
        default=30 * 24 * 3600, ge=1, description="Seconds a user's events live in Redis after the last one."
    )
    gc_freeze: bool = Field(
        default=True,
        description="Exempt what a model load leaves in memory from Python's full garbage collections, which otherwise "
        "walk it and stop every request while they do (off: the interpreter's default).",
    )
    reload_interval_s: float = Field(
        default=30.0,
        ge=0,
        description="Seconds between checks for a new champion (0: never; `POST /v1/admin/reload` asks at once).",
    )
    reload_min_interval_s: float = Field(
        default=5.0, ge=0, description="An admin reload sooner than this after the previous one gets 429."
    )
    torch_threads: int = Field(
        default=1,
        ge=1,
        description="Threads of each model call; 1 leaves the other cores to HTTP and JSON on a small machine.",
    )
    max_batch: int = Field(
        default=64,
        ge=1,
        description="Most requests scored in one model call (batches form only under load: no waiting timer).",
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description="The bearer token of the /v1/admin routes (the environment only: a command line shows in ps).",
    )
    admin_token_file: Path | None = Field(
        default=None,
        description="A file whose first line is the admin token; no token at all: the admin routes are not mounted.",
    )
    api_keys_file: Path | None = Field(
        default=None,
        description="A file of API keys, one per line: every route but /healthz, /readyz and /metrics then needs "
        "one in the X-API-Key header.",
    )
    refusal_delay_s: float = Field(
        default=0.5,
        ge=0,
        le=10,
        description="Seconds a request refused for its API key waits for its 401/403 (slows guessing).",
    )
    adapter_root: Path | None = Field(
        default=None,
        description="The only directory adapters are swapped in from (<root>/<domain>/<version>.pt); unset: off.",
    )
    added_items_file: Path | None = Field(
        default=None,
        description="Where items added at run time (POST /v1/admin/items) are kept across restarts and hot swaps, "
        "until a trained bundle holds them; unset: off.",
    )
    max_added_items: int = Field(
        default=10_000,
        ge=1,
        description="The most run-time items a served model places (those its catalogue lacks): an add past it gets "
        "409, a bundle that would place more is not served.",
    )
    max_body_bytes: int = Field(
        default=1 << 20, ge=1024, description="Larger request bodies get 413 before they are read."
    )
    dashboard_ttl_s: float = Field(
        default=30.0, gt=0, description="Seconds a rendered /dashboard page of a store other than SQLite is reused."
    )
    workers: int = Field(
        default=1,
        ge=1,
        description="Server processes, each loading the model; more than 1 needs the redis history store.",
    )

    @property
    def registry_uri(self) -> str:
        """The MLflow store of the registry: `tracking_uri`, or the platform's default."""
        return resolve_tracking_uri(self.tracking_uri)

    @field_validator("redis_url")
    @classmethod
    def _parseable_redis_url(cls, url: str) -> str:
        import redis

        try:
            redis.ConnectionPool.from_url(url)  # parses only; connects on first use
        except ValueError as err:
            raise ValueError(f"{err}. Fix: e.g. redis://HOST:6379/0 (or rediss:// for TLS)") from err
        return url

    @field_validator("admin_token")
    @classmethod
    def _long_enough(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and len(token.get_secret_value()) < MIN_TOKEN_CHARS:
            raise ValueError("an admin token of fewer than 16 characters is guessable. Fix: `openssl rand -hex 32`")
        return token

    @model_validator(mode="after")
    def _consistent(self) -> ServingSettings:
        if self.admin_token is not None and self.admin_token_file is not None:
            raise ValueError("give admin_token or admin_token_file, not both")
        for name in ("admin_token_file", "api_keys_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: {path} is not a readable file. Fix: point it at the secret's file")
        if self.admin_token_file is not None and self.admin_secret() is None:
            raise ValueError(
                f"admin_token_file: {self.admin_token_file} holds no token of 16+ characters on its first line. "
                "Fix: write one, e.g. `openssl rand -hex 32 > FILE`"
            )
        if self.api_keys_file is not None and not self.api_keys():  # a file given means keys are wanted: never none
            raise ValueError(
                f"api_keys_file: {self.api_keys_file} holds no key (one per line): every route would be open. "
                "Fix: write the keys, e.g. `openssl rand -hex 32 >> FILE`, or unset it to serve without keys"
            )
        unwritable = None if self.added_items_file is None else AddedItemStore(self.added_items_file).unwritable()
        if unwritable is not None:
            raise ValueError(
                f"added_items_file: {unwritable}, so run-time items could never be kept there. Fix: point it at a "
                "file in a writable directory (a volume), or unset it to serve without run-time items"
            )
        if self.adapter_root is not None and not self.adapter_root.is_dir():
            raise ValueError(f"adapter_root: {self.adapter_root} is not a directory. Fix: create it or unset it")
        if self.workers > 1 and self.history_store == "memory":
            raise ValueError(
                "workers > 1 with the in-process history store: each worker would keep its own users' events. "
                "Fix: --history-store redis"
            )
        store_file = sqlite_path(self.registry_uri)
        if self.bundle is None and self.model_name is not None and store_file is not None and not store_file.is_file():
            raise ValueError(
                f"tracking_uri: no MLflow store at {store_file} (serving never creates one). "
                "Fix: the store `recsys pipeline run` registered into, e.g. sqlite:///runs/mlflow.db"
            )
        return self

    def admin_secret(self) -> str | None:
        """The admin bearer token (from the setting or its file), or None: admin routes off."""
        if self.admin_token is not None:
            return self.admin_token.get_secret_value()
        if self.admin_token_file is not None:
            lines = _secret_lines(self.admin_token_file, "admin_token_file")
            return lines[0] if lines and len(lines[0]) >= MIN_TOKEN_CHARS else None
        return None

    def api_keys(self) -> frozenset[str]:
        """The accepted API keys of the public routes (empty: no key required, only without `api_keys_file`)."""
        return (
            frozenset() if self.api_keys_file is None else frozenset(_secret_lines(self.api_keys_file, "api_keys_file"))
        )


def _secret_lines(path: Path, setting: str) -> list[str]:
    """The secrets of a secret's file: its lines stripped, blank lines and `#` comments skipped; ValueError naming the
    setting when it cannot be read or a line holds a space (a comment without its `#` would be a working key)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{setting}: {path} cannot be read ({err}). Fix: point it at the secret's text file") from err
    secrets = []
    for number, line in enumerate(text.splitlines(), 1):
        secret = line.strip()
        if not secret or secret.startswith("#"):
            continue
        if len(secret.split()) > 1:
            raise ValueError(
                f"{setting}: line {number} of {path} holds a space, so it is not one secret. Fix: one secret per "
                "line, without spaces; start a comment with #"
            )
        secrets.append(secret)
    return secrets
