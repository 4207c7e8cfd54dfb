"""Run-time items kept for every bundle served after them, checked before they are used, never acknowledged unless
written: a kept file's bad entry is refused at start-up (file, entry, fix), an acknowledged id answers through every
route after any sequence of hot swaps and rollbacks, an add racing a swap is checked against the model it is placed
in, a bundle that cannot serve the kept items is refused, and a disk that cannot be written is a 507 / 503 with the
served state unchanged and /readyz degraded (a real tmpfs, full or read-only)."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from pipelines.registry import POINT, register_bundle
from recsys.artifacts.added_items import AddedItemStore, NewItem
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.catalogue import CATALOGUE_FILE
from recsys.artifacts.registry import CHAMPION, mlflow_module
from recsys.errors import DataError
from serving import state as state_module
from serving.main import create_app
from serving.settings import ServingSettings
from tests.serving.conftest import ADMIN, ADMIN_TOKEN

RETRAINED = "added-then-trained"  # added under v1; v2's catalogue holds it (as a retrained bundle would)


@pytest.fixture(scope="module")
def two_versions(content_bundle: Bundle, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(tracking URI, model name) of a fresh registry: v1 = the content-first bundle, v2 = the same model whose
    catalogue names its last item RETRAINED; the champion alias on v1."""
    root = tmp_path_factory.mktemp("two-versions")
    uri, name = f"sqlite:///{root / 'mlflow.db'}", "kept-items"
    for bundle in (content_bundle, retrained_with(content_bundle, RETRAINED, root / "bundle-v2")):
        register_bundle(bundle, name, uri, POINT)
    _champion(uri, name, "1")
    return uri, name


def retrained_with(bundle: Bundle, item_id: str, path: Path) -> Bundle:
    """A copy of `bundle` at `path` whose catalogue names its last item `item_id`: the bundle a retraining on an
    item added at run time gives (also used by benchmarks.reliability)."""
    shutil.copytree(bundle.path, path)
    with np.load(path / CATALOGUE_FILE) as arrays:
        columns = dict(arrays)
    offsets = columns["item_id.offsets"]
    columns["item_id.utf8"] = np.concatenate(
        [columns["item_id.utf8"][: offsets[-2]], np.frombuffer(item_id.encode(), dtype=np.uint8)]
    )
    columns["item_id.offsets"] = np.append(offsets[:-1], offsets[-2] + len(item_id.encode()))
    with (path / CATALOGUE_FILE).open("wb") as f:
        np.savez(f, **columns)
    return Bundle(path)


def _champion(uri: str, name: str, version: str) -> None:
    mlflow_module().tracking.MlflowClient(uri).set_registered_model_alias(name, CHAMPION, version)


def _following(uri: str, name: str, kept: Path, **fields: object) -> ServingSettings:
    return ServingSettings(
        model_name=name, tracking_uri=uri, reload_interval_s=0, reload_min_interval_s=0, admin_token=ADMIN_TOKEN,
        added_items_file=kept, **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def _add(client: TestClient, *ids: str) -> httpx.Response:
    return client.post("/v1/admin/items", json={"items": [{"item_id": i, "title": f"new {i}"} for i in ids]},
                       headers=ADMIN)  # fmt: skip


def test_an_acknowledged_item_answers_through_every_route_after_swaps_and_rollbacks(
    two_versions: tuple[str, str], tmp_path: Path
) -> None:
    uri, name = two_versions
    kept = tmp_path / "added.json"
    with TestClient(create_app(_following(uri, name, kept))) as client:
        assert _add(client, RETRAINED, "only-added").status_code == 200
        for version in ("2", "1", "2", "1"):  # promoted, rolled back, again
            _champion(uri, name, version)
            assert client.post("/v1/admin/reload", headers=ADMIN).json()["registry_version"] == version
            for item in (RETRAINED, "only-added"):
                assert client.get(f"/v1/similar-items/{item}").status_code == 200, (version, item)
                reply = client.post("/v1/recommendations", json={"history": [item]}).json()
                assert reply["history_length"] == 1 and reply["unknown_count"] == 0, (version, item)
                events = client.post("/v1/events", json={"user_id": "u-kept", "item_ids": [item]}).json()
                assert events["accepted"] == 1, (version, item)
            live = client.get("/readyz").json()["model_version"]
            assert live.endswith("+items:1" if version == "2" else "+items:2"), "v2 serves its own"
    assert [item.item_id for item in AddedItemStore(kept).load()] == [RETRAINED, "only-added"], "nothing dropped"


def test_an_add_racing_a_swap_is_checked_against_the_model_it_is_placed_in(
    two_versions: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap to v2 (whose catalogue holds the item) is under way when the add comes: the add is placed after it,
    in v2, so it is a 422 naming the item, not a 500 (the check once ran against v1, outside the swap)."""
    uri, name = two_versions
    swapping, release = threading.Event(), threading.Event()
    real = state_module.with_kept_items

    def slow_swap(*args: object, **kwargs: object) -> object:
        if not swapping.is_set():  # the swap to v2: the first load after start-up
            swapping.set()
            release.wait(30)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    _champion(uri, name, "1")
    with TestClient(create_app(_following(uri, name, tmp_path / "added.json"))) as client:
        monkeypatch.setattr(state_module, "with_kept_items", slow_swap)
        _champion(uri, name, "2")
        answers: dict[str, httpx.Response] = {}
        reload = threading.Thread(target=lambda: answers.update(reload=client.post("/v1/admin/reload", headers=ADMIN)))
        reload.start()
        assert swapping.wait(60), "the swap began"
        add = threading.Thread(target=lambda: answers.update(add=_add(client, RETRAINED)))
        add.start()
        release.set()
        reload.join(60)
        add.join(60)
    _champion(uri, name, "1")
    added = answers["add"]
    assert added.status_code == 422, added.text
    assert RETRAINED in added.text and "in the trained catalogue" in added.text
    assert answers["reload"].json()["registry_version"] == "2"


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"item_id": "a", "title": None}, "items[0] ('a'): title is null"),
        ({"item_id": 7, "title": "x"}, "items[0]: item_id is a number"),
        ({"item_id": "a", "title": ["x"]}, "title is a list"),
        ({"item_id": "a", "title": " "}, "title is a text of 1 characters, expected a text of 1-2000 characters"),
        ({"item_id": "a", "title": "x", "fields": {"Bad Name": "y"}}, "field name 'Bad Name'"),
        ({"item_id": "a", "title": "x", "fields": {"brand": 3}}, "fields.brand is a number"),
        ({"item_id": "a", "title": "x", "price": 3}, "unknown keys ['price']"),
        ("a", "the entry is 'a', expected an object"),
    ],
)
def test_a_bad_kept_entry_is_refused_naming_the_file_and_entry(tmp_path: Path, entry: object, says: str) -> None:
    kept = tmp_path / "added.json"
    kept.write_text(json.dumps({"version": 1, "items": [entry]}))
    with pytest.raises(DataError, match="Fix: correct or remove that entry") as raised:
        AddedItemStore(kept).load()
    assert str(raised.value).startswith(f"{kept}: ") and says in str(raised.value)


def test_recsys_serve_refuses_a_bad_kept_entry_before_binding(content_bundle: Bundle, tmp_path: Path) -> None:
    kept = tmp_path / "added.json"
    kept.write_text(json.dumps({"version": 1, "items": [{"item_id": "ok", "title": "x"}, {"item_id": 7}]}))
    said = _refused_by_recsys_serve("--bundle", str(content_bundle.path), "--added-items-file", str(kept))
    assert f"error: {kept}: items[1]: item_id or title is missing" in said and "Fix: correct or remove" in said


def test_a_kept_file_of_text_that_is_not_unicode_is_refused(tmp_path: Path) -> None:
    kept = tmp_path / "added.json"
    kept.write_bytes(b'{"version": 1, "items": [{"item_id": "\\ud800", "title": "x"}]}')
    with pytest.raises(DataError, match="not a file of run-time items"):
        AddedItemStore(kept).load()


def test_a_bundle_that_cannot_serve_the_kept_items_is_refused_before_the_port_is_bound(
    content_bundle: Bundle, registry: tuple[str, str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kept = tmp_path / "added.json"
    AddedItemStore(kept).save([NewItem(f"new-{n}", f"a new lipstick no. {n}") for n in range(3)])
    too_many = _refused_by_recsys_serve("--bundle", str(content_bundle.path), "--added-items-file", str(kept),
                                        "--max-added-items", "2")  # fmt: skip
    assert "keeps 3 run-time items" in too_many and "Fix: raise --max-added-items" in too_many
    uri, name, _ = registry  # an ID-only SASRec cannot place them: they would answer 404
    id_only = _refused_by_recsys_serve("--model-name", name, "--tracking-uri", uri, "--added-items-file", str(kept))
    assert "cannot place items it never trained on" in id_only and "Fix: serve a content-first model" in id_only
    empty = ServingSettings(model_name=name, tracking_uri=uri, added_items_file=tmp_path / "none-yet.json")
    with caplog.at_level(logging.WARNING, logger="serving"), TestClient(create_app(empty)) as client:
        assert client.get("/readyz").json()["status"] == "ok"
    assert "run-time items are off for this model" in caplog.text, "said at start-up, not at the first add"


def test_a_restart_embeds_no_text_it_has_embedded_and_clears_what_a_killed_add_left(
    content_bundle: Bundle, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = ServingSettings(
        bundle=content_bundle.path, admin_token=ADMIN_TOKEN, added_items_file=tmp_path / "a.json"
    )
    with TestClient(create_app(settings)) as client:
        assert _add(client, "n1", "n2").status_code == 200
    killed = tmp_path / ".a.json.k1ll3d00.tmp"  # what an add killed mid-write leaves beside the file
    killed.write_text("{half")
    with caplog.at_level(logging.INFO, logger="recsys"), TestClient(create_app(settings)) as client:
        assert client.get("/readyz").json()["model_version"].endswith("+items:2")
    assert "2 from the cache, 0 embedded" in caplog.text
    assert not killed.exists() and [item.item_id for item in AddedItemStore(tmp_path / "a.json").load()] == ["n1", "n2"]


@contextlib.contextmanager
def tmpfs(disk: Path, size: str = "4m") -> Iterator[Path]:
    """A real tmpfs of `size` mounted at the new directory `disk` until the block ends (root only: OSError naming
    why otherwise; also used by benchmarks.reliability)."""
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        raise OSError(f"cannot mount a tmpfs here (root only): {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def remount(disk: Path, mode: str) -> None:
    """Remount the tmpfs at `disk` read-only ("ro") or writable ("rw")."""
    subprocess.run(["mount", "-o", f"remount,{mode}", str(disk)], check=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 4 MiB tmpfs mounted at a fresh directory (root only: skipped otherwise), unmounted after."""
    mounted = contextlib.ExitStack()
    try:
        disk = mounted.enter_context(tmpfs(tmp_path / "disk"))
    except OSError as err:
        pytest.skip(str(err))
    with mounted:
        yield disk


def test_a_full_or_read_only_disk_refuses_the_add_and_changes_nothing(content_bundle: Bundle, small_disk: Path) -> None:
    kept = small_disk / "added.json"
    settings = ServingSettings(bundle=content_bundle.path, admin_token=ADMIN_TOKEN, added_items_file=kept)
    with TestClient(create_app(settings)) as client:
        assert _add(client, "n1").status_code == 200
        before, file_before = client.get("/readyz").json(), kept.read_bytes()
        assert before["status"] == "ok"
        filler = small_disk / "filler"
        with filler.open("wb") as f:  # the disk full to the last block
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        full = _add(client, "n2")
        assert full.status_code == 507, full.text
        assert "were not added" in full.json()["detail"] and "Fix: free space" in full.json()["detail"]
        ready = client.get("/readyz").json()
        assert ready["status"] == "degraded" and "run-time items cannot be kept" in ready["detail"]
        assert ready["model_version"] == before["model_version"] and kept.read_bytes() == file_before
        assert client.get("/v1/similar-items/n2").status_code == 404, "not acknowledged, not served"
        filler.unlink()
        remount(small_disk, "ro")
        try:
            read_only = _add(client, "n2")
            assert read_only.status_code == 503 and "Fix: make its directory writable" in read_only.text
            assert "not writable" in client.get("/readyz").json()["detail"]
        finally:
            remount(small_disk, "rw")
        assert _add(client, "n2").status_code == 200 and client.get("/readyz").json()["status"] == "ok"
    remount(small_disk, "ro")
    try:
        said = _refused_by_recsys_serve("--bundle", str(content_bundle.path), "--added-items-file", str(kept))
    finally:
        remount(small_disk, "rw")
    assert f"added_items_file: {small_disk} is not writable" in said and "Fix: point it at a file" in said


def _refused_by_recsys_serve(*options: str) -> str:
    """`recsys serve OPTIONS` as a real process that must exit 2 before it binds its port: what it said."""
    recsys = str(Path(sys.executable).with_name("recsys"))  # the console script of this environment
    done = subprocess.run([recsys, "serve", "--port", "0", *options], capture_output=True, text=True, timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in said, said
    return said
