"""A bundle with a corrupt file (cut short by a full disk or a crash, not JSON, JSON of another shape): `recsys serve
--bundle` exits 2 before binding its port, naming the file and what is wrong, never a traceback. (At a hot swap the
current model keeps serving: tests/serving/test_broken_champion.py.)"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from recsys.artifacts.bundle import BUNDLE_FILE
from recsys.artifacts.catalogue import CATALOGUE_FILE
from recsys.artifacts.model_dir import MODEL_FILE
from recsys.artifacts.registry import download_champion_bundle


def _cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _edit_json(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))

    return write


@pytest.mark.parametrize(
    ("file", "corrupt", "message"),
    [
        (BUNDLE_FILE, _cut_short, "not valid JSON: it ends in the middle of a value (cut short?)"),
        (BUNDLE_FILE, lambda p: p.write_text("[1, 2]"), "holds a JSON list, not the object expected"),
        (BUNDLE_FILE, _edit_json(lambda m: {k: v for k, v in m.items() if k != "created"}), "created: Field required"),
        (BUNDLE_FILE, _edit_json(lambda m: {**m, "metrics": {"valid": {}}}), "metrics.valid.ndcg@10: Field required"),
        (f"model/{MODEL_FILE}", _cut_short, "not a model file this version reads"),
        (CATALOGUE_FILE, _cut_short, "not a readable catalogue"),
        ("index/index.json", lambda p: p.write_text("not json"), "not valid JSON (Expecting value, line 1, column 1)"),
        ("index/index.json", _edit_json(lambda m: {**m, "config": {"kind": "flat", "nope": 1}}), "index settings"),
        ("index/index.faiss", _cut_short, "not a FAISS index this version reads"),
        ("index/ids.npy", _cut_short, "not a readable .npy array"),
    ],
)
def test_recsys_serve_of_a_corrupt_bundle_exits_2_naming_the_file(
    registry: tuple[str, str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    file: str,
    corrupt: Callable[[Path], None],
    message: str,
) -> None:
    uri, name, _ = registry

    def bind(*args: object, **kwargs: object) -> None:
        raise AssertionError("recsys serve went on to start the server")

    monkeypatch.setattr("uvicorn.run", bind)
    champion = download_champion_bundle(name, uri)
    assert champion is not None and champion.index_dir is not None
    bundle = Path(shutil.copytree(champion.path, tmp_path / "bundle"))
    corrupt(bundle / file)
    result = CliRunner().invoke(app, ["serve", "--bundle", str(bundle)], env={"RECSYS_MODEL_NAME": ""})
    assert result.exit_code == 2, result.output
    output = " ".join(result.output.split())
    assert output.startswith(f"error: {bundle / file}: ") and message in output and "Fix: " in output
    assert "Traceback" not in result.output
