"""Settings of the online API, from the environment (prefix RECSYS_) or passed to `create_app`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipelines.tracking import resolve_tracking_uri


class ServingSettings(BaseSettings):
    """Which bundle to serve and where user histories live.

    Attributes:
        bundle: a bundle directory (`pipelines.bundle.Bundle`); None = the registered model's champion.
        model_name: the registered model whose `champion` alias is served when `bundle` is None.
        tracking_uri: the MLflow store holding that registry (and the dashboard's runs); None =
            `pipelines.tracking.resolve_tracking_uri`'s default ($MLFLOW_TRACKING_URI, else sqlite:///mlruns.db).
        history_store: "memory" (in-process, the embedded default) or "redis".
        redis_url: the Redis server of the "redis" store.
        events_per_user: most recent online events kept per user (the model reads the most recent of them that its
            history window holds).
        torch_threads: intra-op threads of each model call; 1 leaves the other cores to the event loop (HTTP,
            JSON) on a small machine.
        max_batch: most recommendation requests scored in one model call. Requests that arrive while the model
            is busy are batched together (no waiting timer: a lone request is scored at once).
        reload_interval_s: how often the registry is asked for a new champion (0 = never; only when serving
            `model_name`); `POST /v1/admin/reload` asks at once.
    """

    model_config = SettingsConfigDict(env_prefix="RECSYS_", env_ignore_empty=True, frozen=True)

    bundle: Path | None = None
    model_name: str | None = None
    tracking_uri: str | None = None
    history_store: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    events_per_user: int = Field(default=50, ge=1)
    reload_interval_s: float = Field(default=30.0, ge=0)
    torch_threads: int = Field(default=1, ge=1)
    max_batch: int = Field(default=64, ge=1)

    @property
    def registry_uri(self) -> str:
        """The MLflow store of the registry: `tracking_uri`, or the platform's default."""
        return resolve_tracking_uri(self.tracking_uri)
