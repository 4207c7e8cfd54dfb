"""A registered bundle for the serving tests: one pipeline run into a real MLflow SQLite registry."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from pipelines.config import ExperimentConfig, load_config
from pipelines.registry import download_champion_bundle
from pipelines.runner import run_pipeline
from serving.recommender import Recommender


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., Path]) -> tuple[str, str, Path]:
    """(tracking URI, registered model name, data dir) after one pipeline run (champion = version 1)."""
    work = tmp_path_factory.mktemp("serving")
    config = load_config(tiny_config(work, pipeline={"index": {"kind": "flat"}}))
    reports = {r.name: r.outputs for r in run_pipeline(config, work)}
    return config.tracking.resolved_uri(), config.registered_model_name, Path(reports["prepare_data"]["data_dir"])


def champion_bundle(config: ExperimentConfig) -> tuple[str, str, Path]:
    """(tracking URI, registered model name, champion bundle dir) of a config whose pipeline has run."""
    uri = config.tracking.resolved_uri()
    bundle = download_champion_bundle(config.registered_model_name, uri)
    assert bundle is not None, f"{config.registered_model_name} has no champion in {uri}"
    return uri, config.registered_model_name, bundle


@pytest.fixture(scope="session")
def recommender(registry: tuple[str, str, Path]) -> Recommender:
    """The champion bundle of `registry`, loaded."""
    uri, name, _ = registry
    bundle = download_champion_bundle(name, uri)
    assert bundle is not None
    return Recommender(bundle)


@contextmanager
def recsys_serve(uri: str, model_name: str, *extra: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`recsys serve` of the model's champion as a real process on a free loopback port, once it is ready.

    Yields (base URL, process); the process is terminated on exit (its output stays readable).
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    recsys = str(Path(sys.executable).with_name("recsys"))  # the console script of this environment
    command = [recsys, "serve", "--model-name", model_name, "--tracking-uri", uri, "--port", str(port), *extra]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        else:
            raise AssertionError("the server did not become ready in 60 s")
        yield base, server
    finally:
        server.terminate()
        server.wait(timeout=20)
