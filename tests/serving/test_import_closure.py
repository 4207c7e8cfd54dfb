"""What a server loads: its import closure stays within the library and its own web dependencies.

Measured in a fresh interpreter (this test session has imported everything already): the product modules that
`import serving.main` loads, and what a started app serving a bundle holds besides.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from recsys.artifacts.registry import download_champion_bundle

PRODUCT = ("recsys", "features", "pipelines", "serving", "cli", "dags", "benchmarks")
MAX_PRODUCT_MODULES = 70  # README's architecture section states the measured number
NOT_AT_START = ("polars", "plotly", "mlflow", "sentence_transformers", "transformers")  # only where a feature asks


def loaded_after(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return list(json.loads(done.stdout.splitlines()[-1]))


def product_modules(modules: list[str]) -> list[str]:
    return [m for m in modules if m.split(".")[0] in PRODUCT]


def test_the_server_imports_the_library_and_its_own_modules_alone() -> None:
    modules = loaded_after("import serving.main")
    product = product_modules(modules)
    assert {m.split(".")[0] for m in product} == {"recsys", "serving"}, product
    assert len(product) <= MAX_PRODUCT_MODULES, f"{len(product)} product modules: {product}"
    assert not [m for m in modules if m.split(".")[0] in NOT_AT_START]


def test_a_started_server_of_a_sasrec_bundle_holds_no_data_frame_or_dashboard_library(
    registry: tuple[str, str, Path],
) -> None:
    uri, name, _ = registry
    bundle = download_champion_bundle(name, uri)
    assert bundle is not None
    code = (
        "from fastapi.testclient import TestClient\n"
        "from serving.main import create_app\nfrom serving.settings import ServingSettings\n"
        f"with TestClient(create_app(ServingSettings(bundle={str(bundle.path)!r}))) as client:\n"
        "    assert client.get('/readyz').json()['status'] == 'ok'\n"
        "    assert client.post('/v1/recommendations', json={'user_id': 'u00003', 'k': 3}).status_code == 200\n"
    )
    modules = loaded_after(code)
    assert {m.split(".")[0] for m in product_modules(modules)} == {"recsys", "serving"}
    assert not [m for m in modules if m.split(".")[0] in NOT_AT_START]
