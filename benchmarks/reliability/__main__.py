"""`python -m benchmarks.reliability`: run every group against real processes and write reliability.json."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import REPO, benchmark_parser, log_to_console, provenance, reproduce_of, write_result
from benchmarks.reliability import Settings, api, crashes, enrich, guarded, inputs, load_settings, runtime_items
from benchmarks.reliability import __doc__ as DOC
from benchmarks.reliability.cases import Case
from pipelines.registry import POINT, register_bundle
from pipelines.runner import run_pipeline
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.model_dir import MODEL_FILE, load_model_dir
from recsys.artifacts.registry import download_champion_bundle
from recsys.data.prepared import load_prepared
from recsys.modules.lora import save_adapter

KEYED = "reliability-keyed"  # the API group's second champion, served with API keys

# the Hardening issue's ten findings -> the cases that replay them (every one must be there)
ISSUE_ITEMS = {
    "1 admin without authentication, adapters from any path": ["reload without a token",
                                                               "adapter: a path for a version",
                                                               "reload without admin routes"],
    "2 an untrained model registered as champion": ["config: train.schedule.epochs -1",
                                                    "a first model worse than popularity"],
    "3 no lock on a work directory, the gate's rounded log": ["two runs on one work dir",
                                                              "two runs creating one fresh store"],
    "4 unknown model params, impossible values, late name errors": ["config: unknown key under model.params",
                                                                    "config: num_heads that does not divide dim",
                                                                    "config: a model name typo"],
    "5 a lone surrogate": ["lone surrogate user_id", "events: lone surrogate user"],
    "6 a broken champion": ["reload of a broken champion", "readiness names the broken champion",
                            "failed reloads counted", "reload flood"],
    "7 an unbalanced quote swallowing rows": ["data: unbalanced quote in items.csv"],
    "8 unbounded memory and echoes": ["a flood of new users", "user_id of 100 kB: no echo", "history id of 257 chars",
                                      "timestamp 2^63"],
    "9 raw tracebacks, stale temp dirs, RUNNING runs": ["data: items.csv that cannot be read",
                                                        "data: --out whose parent is a file",
                                                        "kill -9 mid-training, then the same command"],
    "10 Redis down": ["one warning, not one per request", "metrics while Redis is down"],
}  # fmt: skip
# the second review's findings (an outside probe) -> the cases that replay them
SECOND_REVIEW_ITEMS = {
    "1 an adapter symlink loop": ["adapter: a symlink to itself", "adapter: a loop of two symlinks"],
    "2 a server path in an adapter error": ["adapter: a file of other keys names no server path"],
    "3 the dashboard open to anyone, rendered per request": ["anonymous dashboard", "anonymous /docs",
                                                             "anonymous /openapi.json", "keyed dashboard again: 304",
                                                             "a keyed client beside anonymous dashboard readers"],
    "4 a config that is not UTF-8": ["config: a UTF-16 file"],
    "5 duplicate YAML keys": ["config: a section twice"],
    "6 bad values in data files": ["data: ratings.csv timestamp -978300000", "data: ratings.csv timestamp 10^17",
                                   "data: rating nan", "data: amazon-raw unixReviewTime -5",
                                   "data: unbalanced quote in ratings.csv"],
    "7 echoes": ["similar items: id of 65,000 chars: no echo", "1,000 unknown history ids: counted, 20 named"],
    "8 model_version growing with each swap": ["adapter: the same file swapped in 7 times"],
    "9 loose edges": ["config: a file source without data.path", "config: a failed data step lets go of its lock",
                      "k true: not a number", "config: epochs: true", "config: lr a quoted string",
                      "anonymous malformed body: 401 before 400"],
}  # fmt: skip

# the third review's findings and newcomer points (issue 54) -> the cases that replay them
THIRD_REVIEW_ITEMS = {
    "1 enrich dies on one bad answer": ["enrich: every 7th answer html", "enrich: every 7th answer list",
                                        "enrich: every 7th answer usage-text", "enrich: every 7th answer usage-lots",
                                        "enrich: 429 with Retry-After -1", "enrich: 429 with Retry-After nan",
                                        "enrich: three --limit 40 runs, HTML every 7th"],
    "2 --records not validated": ["enrich --records: attempts as text", "enrich --records: created_at as text",
                                  "enrich --records: status 1", "enrich --records: status weird",
                                  "enrich --records: keywords a string",
                                  "enrich --records: a 100,000-character description",
                                  "enrich --records: a null category"],
    "3 a kept item with a null title": ["kept file: a null title", "add: a null title"],
    "4 an API-keys file without a key": ["an API-keys file without a key"],
    "5 an add racing a hot swap": ["adds racing hot swaps"],
    "6 an outage cached as permanent failure": ["enrich: an outage (a 500 on every request)",
                                                "enrich: an outage (a closed port)"],
    "7 a full or read-only disk": ["add on a full disk", "readiness on a full disk", "add on a read-only disk",
                                   "start with the kept file on a read-only disk"],
    "8 a rollback loses run-time items": ["acknowledged ids through every route, after rollback 1",
                                          "acknowledged ids through every route, after rollback 2",
                                          "the kept file after swaps, rollbacks and racing adds"],
    "9 large adds stall recommendations": ["a 1,000-item add under requests"],  # the p99: runtime-items-load.json
    "10 the config name is a path": ["config: name ../../esc", "config: name an absolute path", "config: name a/b"],
    "11 tracebacks instead of error and fix": [
        "config: a key under a string: model.name.x", "config: a 5,000-digit dim", "enrich input: --data-dir missing",
        "enrich input: --data-dir a file", "enrich input: --data-dir empty", "enrich input: garbage items.parquet",
        "enrich input: integer item ids", "enrich input: --first binary", "enrich input: cache not SQLite",
        "config: compare_with evaluation.json cut short", "config: compare_with per_user.npz text",
        "kept file: an integer item_id", "kept file: a list title"],
    "12 re-embedding, --max-added-items, a per-read timeout, the similar-items 404": [
        "restart after kill -9 mid-add", "--max-added-items below the kept file's count",
        "enrich: a byte a second, --timeout-s 1", "similar items of an unknown 256-char id: no echo"],
    "newcomer: a body without the JSON content type": ["text/plain body", "recommendations sent as a form (curl -d)",
                                                       "add: sent as a form (curl -d)"],
    "newcomer: /docs without internet": ["/docs without internet: every asset from this server"],
    "newcomer: kept items over an ID-only model": ["kept items over an ID-only model"],
}  # fmt: skip


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser(DOC or "", "benchmarks/configs/reliability.yaml")
    parser.add_argument("--work-dir", type=Path, default=Path(".cache/bench-reliability"), help="emptied first")
    args = parser.parse_args(argv)
    log_to_console()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request of the hundreds sent
    reproduce = reproduce_of("benchmarks.reliability", args)
    settings = load_settings(args.config, reproduce.overrides)
    work = args.work_dir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    cases, fuzz, model_dir, dashboard_load = _api_cases(settings, work / "api")
    cases += _runtime_item_cases(settings, work / "runtime-items", work / "api")
    cases += enrich.enrich_cases(work / "enrich")
    config = settings.experiment_config()
    small = work / "inputs" / "experiment.yaml"  # the experiment with its overrides, for the commands' --config
    small.parent.mkdir()
    small.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_none=True)))
    cases += inputs.data_cases(work / "inputs") + inputs.config_cases(work / "inputs", REPO / settings.experiment)
    cases += inputs.override_cases(work / "overrides", small) + inputs.compare_with_cases(work / "compare", small)
    cases += [
        crashes.killed_mid_training(config, work / "crashes", settings.crash_epochs),
        crashes.two_runs_on_one_work_dir(config, work / "crashes"),
        crashes.two_runs_on_a_fresh_store(config, work / "crashes"),
        crashes.worse_than_popularity(model_dir, config.registered_model_name, work / "crashes"),
    ]
    names = {case.name for case in cases}
    items = {**ISSUE_ITEMS, **{f"second review {k}": v for k, v in SECOND_REVIEW_ITEMS.items()},
             **{f"third review {k}": v for k, v in THIRD_REVIEW_ITEMS.items()}}  # fmt: skip
    missing = {item: [n for n in replays if n not in names] for item, replays in items.items()}
    assert not any(missing.values()), f"issue items without their cases: {missing}"
    result = {
        "cases": len(cases),
        "api_inputs": sum(case.group.startswith("api") for case in cases),
        "bad_files_and_configs": sum(case.group == "inputs" for case in cases),
        "runtime_items": sum(case.group == runtime_items.GROUP for case in cases),
        "enrich": sum(case.group == enrich.GROUP for case in cases),
        "server_errors": sum(case.server_error for case in cases),
        "tracebacks": sum(case.traceback for case in cases),
        "unclear_messages": sum(not case.clear for case in cases),
        "data_lost": sum(case.data_lost for case in cases),
        "schemathesis": fuzz,
        "issue_items": ISSUE_ITEMS,
        "second_review_items": SECOND_REVIEW_ITEMS,
        "third_review_items": THIRD_REVIEW_ITEMS,
        "dashboard_load": dashboard_load,
        "unclear": [
            f"{c.group}: {c.name}: expected {c.expected}, got {c.outcome}: {c.message}" for c in cases if not c.clear
        ],
        "by_case": [case.record() for case in cases],
        "settings": {"experiment": settings.experiment, "experiment_overrides": settings.experiment_overrides},
        **provenance("fastapi", "uvicorn", "redis", "schemathesis"),
    }
    path = write_result("reliability", result, args.results_dir, reproduce)
    keys = ("cases", "api_inputs", "bad_files_and_configs", "runtime_items", "enrich", "server_errors", "tracebacks",
            "unclear_messages", "data_lost", "unclear")  # fmt: skip
    print(json.dumps({k: result[k] for k in keys}, indent=1))
    print(f"-> {path}")
    return path


def _api_cases(settings: Settings, work: Path) -> tuple[list[Case], dict[str, Any], Path, dict[str, Any]]:
    """The champion of the experiment (one pipeline run), then every server the API group needs; (cases, the
    schemathesis run, the champion's model directory, the dashboard-load measurement)."""
    config = settings.experiment_config({"tracking.uri": f"sqlite:///{work / 'mlflow.db'}"})
    outputs, _ = run_pipeline(config, work)
    assert outputs.data is not None and outputs.model is not None
    name, uri = config.registered_model_name, config.tracking.resolved_uri()
    data = load_prepared(outputs.data.data_dir)
    items, user = data.items["item_id"].to_list(), data.users["user_id"][0]
    (work / "token").write_text(api.TOKEN)
    token = ["--admin-token-file", str(work / "token")]
    memory = [*token, "--max-users", str(settings.max_users)]
    with api.served(name, uri, work, *memory) as server:
        cases = api.hostile_requests(server, "api: in-process store", items, user)
        cases.append(api.flood_of_new_users(server, "api: in-process store", items[0], settings.flood_users,
                                            settings.max_users))  # fmt: skip
    with api.served(name, uri, work, *token, "--history-store", "redis", "--redis-url", api.REDIS_URL) as server:
        cases += api.hostile_requests(server, "api: Redis store", items, user)
    with api.served(name, uri, work, *token, "--reload-min-interval-s", "0") as server:  # every reload exercised
        fuzz = api.schemathesis(server, settings.fuzz_examples, work)
    with api.served(name, uri, work) as server:
        cases += api.no_admin_token(server)
    with api.served(name, uri, work, "--history-store", "redis", "--redis-url", api.DOWN_URL) as server:
        cases += api.redis_down(server, items[0])
    with api.served(name, uri, work, *token) as server:
        broken = work / "broken-model"  # a better validation score, weights that cannot be read
        shutil.copytree(outputs.model.model_dir, broken)
        metrics = json.loads((broken / "metrics.json").read_text())
        metrics["valid"]["ndcg@10"] += 1.0
        (broken / "metrics.json").write_text(json.dumps(metrics))
        (broken / MODEL_FILE).write_bytes(b"not a model")
        register_bundle(Bundle.write(work / "broken-bundle", name=name, model_dir=broken), name, uri, POINT)
        cases += api.broken_champion(server, settings.reload_flood)
    (work / "keys").write_text(guarded.KEY + "\n")
    keyed = settings.experiment_config({"tracking.uri": uri, "name": KEYED})
    run_pipeline(keyed, work)  # its own champion: the broken one above stays the first's
    with api.served(keyed.registered_model_name, uri, work, "--api-keys-file", str(work / "keys")) as server:
        cases += guarded.keyed_routes(server, user)
        load_case, dashboard_load = guarded.dashboard_under_load(server, user, settings.dashboard_load_seconds)
        cases.append(load_case)
    cases += _adapter_cases(settings, outputs.model.model_dir, uri, work, token)
    return cases, fuzz, outputs.model.model_dir, dashboard_load


def _runtime_item_cases(settings: Settings, work: Path, api_work: Path) -> list[Case]:
    """A content-first champion (`content_overrides`: it places new items by their text) trained here, and the API
    group's keyed ID-only champion (which cannot; its first champion is broken on purpose): the run-time items
    group."""
    uri = f"sqlite:///{api_work / 'mlflow.db'}"
    content = settings.experiment_config({"tracking.uri": uri, **settings.content_overrides})
    run_pipeline(content, work)
    bundle = download_champion_bundle(content.registered_model_name, uri)
    assert bundle is not None, f"{content.registered_model_name} was not registered in {uri}"
    id_only = settings.experiment_config({"tracking.uri": uri, "name": KEYED})
    return runtime_items.runtime_item_cases(bundle, (id_only.registered_model_name, uri), work / "cases")


def _adapter_cases(settings: Settings, base_dir: Path, uri: str, work: Path, token: list[str]) -> list[Case]:
    """A domain-adapted champion over the experiment's model (the synthetic data's domains), served with an admin
    token and an adapter root: the adapter-file cases."""
    model = {"name": "domain_adapters", "upstream": {"base": str(base_dir)}, "params": {"rank": 2}}
    config = settings.experiment_config({"tracking.uri": uri, "name": "reliability-adapters", "model": model})
    outputs, _ = run_pipeline(config, work)
    assert outputs.model is not None
    trained = load_model_dir(outputs.model.model_dir).model
    domain = trained.domains[0]
    adapter = work / "trained-adapter.pt"
    save_adapter(trained, domain, adapter)
    with api.served(config.registered_model_name, uri, work, *token) as server:
        return guarded.adapter_files(server, work / "adapters", domain, adapter)


if __name__ == "__main__":
    main()
