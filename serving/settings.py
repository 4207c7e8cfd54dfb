"""Settings of the online API, from the environment (prefix RECSYS_) or passed to `create_app`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipelines.tracking import resolve_tracking_uri

SQLITE_PREFIX = "sqlite:///"
MIN_TOKEN_CHARS = 16  # shorter admin tokens are refused: guessable


class ServingSettings(BaseSettings):
    """Which bundle to serve, where user histories live, and who may call what.

    Attributes:
        bundle: a bundle directory (`pipelines.bundle.Bundle`); None = the registered model's champion.
        model_name: the registered model whose `champion` alias is served when `bundle` is None.
        tracking_uri: the MLflow store holding that registry (and the dashboard's runs); None =
            `pipelines.tracking.resolve_tracking_uri`'s default ($MLFLOW_TRACKING_URI, else sqlite:///mlruns.db).
            A SQLite store must exist: serving never creates an empty one.
        history_store: "memory" (in-process, the embedded default) or "redis" (shared by workers and replicas).
        redis_url: the Redis server of the "redis" store.
        events_per_user: most recent online events kept per user (the model reads the most recent of them that its
            history window holds).
        max_users: users whose online events the in-process store keeps; the least recently active are dropped
            first (Redis keys expire after `history_ttl_s` instead).
        history_ttl_s: seconds a user's online events live in Redis after their last event.
        torch_threads: intra-op threads of each model call; 1 leaves the other cores to the event loop (HTTP,
            JSON) on a small machine.
        max_batch: most recommendation requests scored in one model call. Requests that arrive while the model
            is busy are batched together (no waiting timer: a lone request is scored at once).
        reload_interval_s: how often the registry is asked for a new champion (0 = never; only when serving
            `model_name`); `POST /v1/admin/reload` asks at once.
        reload_min_interval_s: an admin reload sooner than this after the previous one is refused (429).
        admin_token / admin_token_file: the bearer token of the `/v1/admin` routes (the file: its first line).
            Neither set = the admin routes are not mounted at all.
        api_keys_file: one API key per line; when set, every route but `/healthz`, `/readyz` and `/metrics` requires
            one in the `X-API-Key` header (the `/v1` routes, the dashboard, `/docs`, `/openapi.json`).
        refusal_delay_s: how long a request refused for its API key (401 / 403) waits before its answer: a client
            looping without a key, or guessing keys, is slowed to a few requests per second per connection at no CPU
            cost (0 = answer at once).
        adapter_root: the only directory adapters are loaded from (`<root>/<domain>/<version>.pt`); None = adapter
            swaps are off.
        added_items_file: where the items added at run time (`POST /v1/admin/items`) are kept, so that a restart or a
            hot swap serves them again until a trained bundle includes them; None = run-time items are off.
        max_added_items: the most items kept added at run time (a larger total is refused, 409): their exact index is
            searched beside the bundle's on every similar-items request.
        max_body_bytes: larger request bodies are refused (413) before they are read.
        dashboard_ttl_s: how long a rendered dashboard page of a store other than SQLite is served before the store
            is read again (a SQLite store's page is re-rendered when its file changes).
        workers: server processes (`recsys serve --workers`); each loads the model and follows the champion.
    """

    model_config = SettingsConfigDict(env_prefix="RECSYS_", env_ignore_empty=True, frozen=True)

    bundle: Path | None = None
    model_name: str | None = None
    tracking_uri: str | None = None
    history_store: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    events_per_user: int = Field(default=50, ge=1, le=10_000)
    max_users: int = Field(default=100_000, ge=1)
    history_ttl_s: int = Field(default=30 * 24 * 3600, ge=1)
    reload_interval_s: float = Field(default=30.0, ge=0)
    reload_min_interval_s: float = Field(default=5.0, ge=0)
    torch_threads: int = Field(default=1, ge=1)
    max_batch: int = Field(default=64, ge=1)
    admin_token: SecretStr | None = None
    admin_token_file: Path | None = None
    api_keys_file: Path | None = None
    refusal_delay_s: float = Field(default=0.5, ge=0, le=10)
    adapter_root: Path | None = None
    added_items_file: Path | None = None
    max_added_items: int = Field(default=10_000, ge=1)
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    dashboard_ttl_s: float = Field(default=30.0, gt=0)
    workers: int = Field(default=1, ge=1)

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
        if self.adapter_root is not None and not self.adapter_root.is_dir():
            raise ValueError(f"adapter_root: {self.adapter_root} is not a directory. Fix: create it or unset it")
        if self.workers > 1 and self.history_store == "memory":
            raise ValueError(
                "workers > 1 with the in-process history store: each worker would keep its own users' events. "
                "Fix: --history-store redis"
            )
        uri = self.registry_uri
        store_file = Path(uri.removeprefix(SQLITE_PREFIX)) if uri.startswith(SQLITE_PREFIX) else None
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
            lines = self.admin_token_file.read_text().strip().splitlines()
            return lines[0].strip() if lines and len(lines[0].strip()) >= MIN_TOKEN_CHARS else None
        return None

    def api_keys(self) -> frozenset[str]:
        """The accepted API keys of the public routes (empty: no key required)."""
        if self.api_keys_file is None:
            return frozenset()
        return frozenset(line.strip() for line in self.api_keys_file.read_text().splitlines() if line.strip())
