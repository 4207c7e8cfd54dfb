"""`recsys demo`: the platform's main job on the embedded synthetic data, end to end, in a minute or two.

The pipeline for SASRec on the synthetic data (prepare, train, FAISS index, evaluation with slices, bundle
registered in MLflow, champion gate) -> popularity (the baseline) on the same data -> print the test metrics side by
side -> start the online API on 127.0.0.1 over the registered champion -> real HTTP requests: recommendations
for three users, an event and the recommendation that follows it, similar items, the evaluation dashboard ->
print them -> stop the API.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import handle_errors
from cli.render import HISTORY_HEADER, metrics_table, print_tables, recommendations_table
from recsys.artifacts.evaluation_dir import DASHBOARD_FILE
from recsys.errors import RecsysError

DEFAULT_CONFIG = Path("configs/synthetic/sasrec.yaml")


def demo_command(
    out: Annotated[Path, typer.Option("--out", help="Working directory (data, models, MLflow store).")] = Path(".demo"),
    config: Annotated[
        Path, typer.Option("--config", help="Experiment config of the sequential model.")
    ] = DEFAULT_CONFIG,
    num_users: Annotated[int, typer.Option("--show-users", help="Users to show recommendations for.")] = 3,
) -> None:
    """Run the SASRec pipeline and popularity on the synthetic data, serve the champion, query it over HTTP."""
    from pipelines.config import load_config

    with handle_errors():
        out = out.resolve()
        tracking = {"tracking.uri": f"sqlite:///{out / 'mlflow.db'}"}
        sequential = load_config(config, tracking)
        popularity = load_config(config, {**tracking, "model": {"name": "popularity"}, "name": "popularity"})
        from pipelines.runner import run_pipeline  # after the config: its errors come before MLflow's import

        typer.echo(f"pipeline {sequential.name}: prepare -> train -> index -> evaluate -> register ...")
        outputs, _ = run_pipeline(sequential, out)
        assert outputs.data is not None and outputs.model is not None and outputs.registration is not None
        assert outputs.evaluation is not None
        typer.echo("popularity (the baseline) on the same data ...")
        baseline, _ = run_pipeline(popularity, out, until="train_retriever", data_dir=outputs.data.data_dir)
        assert baseline.model is not None
        rows = {
            "popularity": _test_row(baseline.model.metrics),
            sequential.model.name: _test_row(outputs.model.metrics),
        }
        gate = outputs.registration.decision
    print_tables(metrics_table("test metrics (leave-one-out, full ranking)", rows, extra=("train_seconds",)))
    typer.echo(f"registered {gate.model_name} v{gate.version}: {gate.reason}")
    with handle_errors():
        _serve_and_query(sequential.registered_model_name, tracking["tracking.uri"], outputs.data.data_dir, num_users)
    uri = tracking["tracking.uri"]
    typer.echo(f"MLflow store: {uri}  (browse it: .venv/bin/mlflow ui --backend-store-uri {uri})")
    typer.echo(f"serve it yourself: .venv/bin/recsys serve --model-name {gate.model_name} --tracking-uri {uri}")
    typer.echo("  (or `make serve`), then open the dashboard at http://127.0.0.1:8000/dashboard")
    page = outputs.evaluation.evaluation_dir / DASHBOARD_FILE
    typer.echo(f"this pipeline run's evaluation dashboard (a file, also an MLflow artifact): {page}")


def _test_row(metrics: dict[str, Any]) -> dict[str, float]:
    return {**metrics["test"], "train_seconds": metrics["train_seconds"]}


def _serve_and_query(model_name: str, tracking_uri: str, data_dir: Path, num_users: int) -> None:
    """The API on a free loopback port in a background thread; real HTTP requests; then shut it down."""
    import httpx
    import uvicorn

    from recsys.data.prepared import load_prepared
    from serving.main import create_app
    from serving.settings import ServingSettings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = ServingSettings(model_name=model_name, tracking_uri=tracking_uri, reload_interval_s=0)
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RecsysError(f"the API did not start on {base}. Fix: see the log above (port or bundle problem)")
            time.sleep(0.1)
        typer.echo(f"online API up on {base} (OpenAPI: {base}/docs)")
        data = load_prepared(data_dir)
        with httpx.Client(base_url=base, timeout=30) as http:
            tables = []
            for user_id in data.users["user_id"].head(num_users).to_list():
                history = data.titles(data.sequences.row(data.user_row(user_id))[-5:])
                body = http.post("/v1/recommendations", json={"user_id": user_id, "k": 10}).raise_for_status().json()
                tables.append(_table(f"POST /v1/recommendations user {user_id}", history, body))
            query = data.items.row(0, named=True)  # the item the similar items are for
            item = query["item_id"]
            newcomer = {"user_id": "demo-newcomer", "item_ids": data.items["item_id"].head(3).to_list()}
            before = http.post("/v1/recommendations", json={"user_id": "demo-newcomer", "k": 5}).json()
            http.post("/v1/events", json=newcomer).raise_for_status()
            after = http.post("/v1/recommendations", json={"user_id": "demo-newcomer", "k": 5}).json()
            similar = http.get(f"/v1/similar-items/{item}", params={"k": 5}).raise_for_status().json()
            dashboard = http.get("/dashboard").raise_for_status().text
        tables.append(_table("a new user before any event", [], before))
        posted = data.items["title"].head(3).to_list()
        tables.append(_table("the same user after POST /v1/events of these 3 items", posted, after))
        shown = item if not query["title"] else f"{query['title']} ({item})"
        tables.append(_table(f"GET /v1/similar-items/{item}", [shown], similar, "items similar to", "similar items"))
        print_tables(*tables)
        charts = dashboard.count('class="plotly-graph-div')
        typer.echo(
            f"evaluation dashboard: {base}/dashboard ({charts} charts, {len(dashboard) / 1e6:.1f} MB with plotly.js "
            "inlined; runs, metrics across runs and models, slices)"
        )
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _table(
    title: str, history: list[str], body: dict[str, Any], history_header: str = HISTORY_HEADER,
    list_header: str = "recommended next",
) -> Any:  # fmt: skip
    source = f" (source: {body['source']})" if "source" in body else ""
    ranked = [(i["title"], i["score"]) for i in body["items"]]
    return recommendations_table(title + source, history, ranked, history_header, list_header)
