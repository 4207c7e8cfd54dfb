"""`recsys serve` as a real server process on loopback, answering real HTTP requests; configured by its options or,
as documented, by the RECSYS_* environment alone."""

from __future__ import annotations

import os
import select
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from cli import app
from recsys.artifacts.registry import get_champion
from recsys.data.prepared import load_prepared
from tests.conftest import SERVER_START_S, recsys_serve


def test_recsys_serve_answers_http(registry: tuple[str, str, Path]) -> None:
    uri, name, data_dir = registry
    items = load_prepared(data_dir).items["item_id"].to_list()[:3]
    with recsys_serve("--model-name", name, "--tracking-uri", uri, "--events-per-user", "2") as (base, server):
        response = httpx.post(f"{base}/v1/recommendations", json={"user_id": "u00003", "k": 3}, timeout=10)
        assert response.status_code == 200 and len(response.json()["items"]) == 3
        httpx.post(f"{base}/v1/events", json={"user_id": "new-user", "item_ids": items}, timeout=10)
        new_user = httpx.post(f"{base}/v1/recommendations", json={"user_id": "new-user"}, timeout=10).json()
        assert new_user["history_length"] == 2  # the option reached the history store: the oldest event was dropped
        assert httpx.get(f"{base}/openapi.json", timeout=5).json()["paths"].keys() >= {
            "/v1/recommendations",
            "/v1/events",
        }
    assert server.stdout is not None
    assert "serving tiny-sasrec@" in server.stdout.read()


def test_the_environment_alone_configures_recsys_serve(registry: tuple[str, str, Path]) -> None:
    uri, name, _ = registry
    token = "t" * 32
    env = {
        "RECSYS_TRACKING_URI": uri, "RECSYS_MODEL_NAME": name, "RECSYS_HISTORY_STORE": "memory",
        "RECSYS_ADMIN_TOKEN": token, "RECSYS_RELOAD_MIN_INTERVAL_S": "0",
    }  # fmt: skip
    with recsys_serve(env={**env, "MLFLOW_TRACKING_URI": "sqlite:////nonexistent/other.db"}) as (base, server):
        ready = httpx.get(f"{base}/readyz", timeout=5).json()
        headers = {"Authorization": f"Bearer {token}"}
        reloaded = httpx.post(f"{base}/v1/admin/reload", headers=headers, timeout=10).json()
        recommended = httpx.post(f"{base}/v1/recommendations", json={"user_id": "u00003", "k": 3}, timeout=10)
    champion = get_champion(name, uri)
    assert champion is not None
    assert reloaded["registry_version"] == champion.version  # the registry of RECSYS_TRACKING_URI, not MLflow's
    assert ready["model_version"].startswith(f"{name}@") and recommended.status_code == 200
    assert server.stdout is not None and f"serving {name}@" in server.stdout.read()


def test_nothing_to_serve_exits_2_with_the_fix() -> None:
    result = CliRunner().invoke(app, ["serve"], env={"RECSYS_MODEL_NAME": "", "RECSYS_BUNDLE": ""})
    assert result.exit_code == 2 and "nothing to serve" in result.output and "RECSYS_MODEL_NAME" in result.output


def test_a_server_that_never_becomes_ready_fails_the_test_with_its_exit_status_and_output() -> None:
    with pytest.raises(AssertionError) as failed, recsys_serve("--tracking-uri", "sqlite:////nonexistent/mlflow.db"):
        pass
    assert "exited with status 2" in str(failed.value) and "nothing to serve" in str(failed.value)


def test_every_serving_setting_but_secrets_is_an_option_that_names_its_variable() -> None:
    """The options are made from the settings: a new field is an option with its description as help, and a secret
    (visible in `ps` on a command line) is none."""
    from pydantic import SecretStr

    from serving.settings import ServingSettings

    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "400"})
    help_text = " ".join(result.output.split())
    for name, field in ServingSettings.model_fields.items():
        option = f"--{name.replace('_', '-')} "
        if SecretStr in getattr(field.annotation, "__args__", (field.annotation,)):
            assert option not in help_text, name
            continue
        assert option in help_text and f"RECSYS_{name.upper()}" in help_text, name
        assert str(field.description)[:40] in help_text, name
    assert "--admin-token " not in help_text and "--admin-token-file " in help_text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--redis-url", "http://not-redis", "--history-store", "redis"], "redis_url"),
        (["--tracking-uri", "sqlite:////nonexistent/mlflow.db"], "no MLflow store at /nonexistent/mlflow.db"),
        (["--workers", "2"], "Fix: --history-store redis"),
        (["--admin-token-file", "/nonexistent/token"], "admin_token_file"),
    ],
)
def test_bad_serving_settings_exit_2_before_binding(
    registry: tuple[str, str, Path], options: list[str], message: str
) -> None:
    uri, name, _ = registry
    result = CliRunner().invoke(app, ["serve", "--model-name", name, "--tracking-uri", uri, *options])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_two_workers_share_the_redis_history(registry: tuple[str, str, Path]) -> None:
    uri, name, data_dir = registry
    redis_url = "redis://127.0.0.1:6379/14"
    items = load_prepared(data_dir).items["item_id"].to_list()[:3]
    user = f"workers-{uuid.uuid4().hex[:8]}"
    options = ["--model-name", name, "--tracking-uri", uri, "--workers", "2", "--history-store", "redis"]
    with recsys_serve(*options, "--redis-url", redis_url) as (base, server):
        # /readyz answered once one worker is up: wait for the other (on a busy machine it loads seconds later)
        loaded = lines_until(server, "serving tiny-sasrec@", count=2, timeout_s=SERVER_START_S)
        posted = httpx.post(f"{base}/v1/events", json={"user_id": user, "item_ids": items}, timeout=10)
        lengths = {  # a new connection per request: both workers answer
            httpx.post(f"{base}/v1/recommendations", json={"user_id": user}, timeout=10).json()["history_length"]
            for _ in range(8)
        }
    assert posted.status_code == 200 and lengths == {3}
    assert loaded == 2  # each worker loaded the model


def lines_until(server: subprocess.Popen[str], text: str, count: int, timeout_s: float) -> int:
    """Read the server's output until `text` appeared `count` times (or `timeout_s` passed); how often it did. Raw
    reads of the pipe: a text wrapper's buffer would hold lines that `select` no longer sees."""
    assert server.stdout is not None
    output, deadline = b"", time.monotonic() + timeout_s
    while output.count(text.encode()) < count and time.monotonic() < deadline:
        ready, _, _ = select.select([server.stdout], [], [], 1.0)
        if ready:
            output += os.read(server.stdout.fileno(), 65536)
    return output.count(text.encode())


def test_an_id_only_model_with_run_time_items_on_says_so_at_start_and_an_add_answers_409_with_why(
    registry: tuple[str, str, Path], tmp_path: Path
) -> None:
    """docs/serving.md: an ID-only model with --added-items-file and nothing kept starts with a warning saying that adds
    will answer 409 (with items kept, it exits 2: tests/serving/test_kept_items.py)."""
    uri, name, _ = registry  # SASRec without content_first: its item vectors are ids, it cannot place a new item
    token = tmp_path / "token.txt"
    token.write_text("t" * 32)
    options = ["--model-name", name, "--tracking-uri", uri, "--admin-token-file", str(token)]
    with recsys_serve(*options, "--added-items-file", str(tmp_path / "added.json")) as (base, server):
        added = httpx.post(
            f"{base}/v1/admin/items", json={"items": [{"item_id": "new-1", "title": "a new lipstick"}]},
            headers={"Authorization": f"Bearer {'t' * 32}"}, timeout=30,
        )  # fmt: skip
    assert added.status_code == 409, added.text
    assert "cannot place items it never trained on" in added.json()["detail"] and "content_first" in added.text
    assert server.stdout is not None
    started = server.stdout.read()
    assert "run-time items are off for this model" in started and "POST /v1/admin/items answers 409" in started
    assert started.index("run-time items are off") < started.index(f"serving {name}@"), "said before it serves"
