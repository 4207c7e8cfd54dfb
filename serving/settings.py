"""Settings of the online API, from the environment (prefix RECSYS_) or passed to `create_app`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServingSettings(BaseSettings):
    """Which bundle to serve and where user histories live.

    Attributes:
        bundle: a bundle directory (`pipelines.registry.write_bundle`); None = the registered model's champion.
        model_name: the registered model whose `champion` alias is served when `bundle` is None.
        tracking_uri: the MLflow store holding that registry.
        history_store: "memory" (in-process, the embedded default) or "redis".
        redis_url: the Redis server of the "redis" store.
        max_history: most recent events kept per user (and fed to the model).
        torch_threads: intra-op threads of each model call; 1 leaves the other cores to the event loop (HTTP,
            JSON) on a small machine.
        max_batch: most recommendation requests scored in one model call. Requests that arrive while the model
            is busy are batched together (no waiting timer: a lone request is scored at once).
        reload_interval_s: how often the registry is asked for a new champion (0 = never; only when serving
            `model_name`); `POST /v1/admin/reload` asks at once.
    """

    model_config = SettingsConfigDict(env_prefix="RECSYS_", frozen=True)

    bundle: Path | None = None
    model_name: str | None = None
    tracking_uri: str = "sqlite:///mlruns.db"
    history_store: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    max_history: int = 50
    reload_interval_s: float = 30.0
    torch_threads: int = Field(default=1, ge=1)
    max_batch: int = Field(default=64, ge=1)
