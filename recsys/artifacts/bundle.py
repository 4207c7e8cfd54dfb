"""The model bundle: one directory holding everything serving needs, a versioned unit of the model registry.

    bundle.json            name, creation time, valid/test metrics and the popularity baseline's valid metrics,
                           what it holds, the source fingerprints
    model/                 the model directory (`recsys.artifacts.model_dir`: weights, config, id maps, metrics)
    catalogue.npz          the items (ids, titles, training counts) and the users' histories of the data it was
                           trained on (`recsys.artifacts.catalogue`), so a bundle served on another machine needs
                           nothing else
    index/                 the FAISS index of the model's item vectors (models that have them)
    semantic_ids.parquet   the semantic IDs (models that use them)

`Bundle` is the one owner of this layout: the pipeline writes bundles with `Bundle.write`, serving and the index
refresh read them through its properties.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from recsys.artifacts.catalogue import CATALOGUE_FILE, write_catalogue
from recsys.artifacts.model_dir import POPULARITY_VALID, read_metrics, trained_data
from recsys.errors import RecsysError
from recsys.runtime.atomic import atomic_directory
from recsys.runtime.json_files import read_json_shaped

BUNDLE_FILE = "bundle.json"
REASSEMBLE = "assemble the bundle again (`recsys pipeline run --config CONFIG --rerun register`)"


class _Metrics(BaseModel):
    model_config = ConfigDict(extra="allow")

    ndcg_at_10: float = Field(alias="ndcg@10")


class _BundleMetrics(BaseModel):
    model_config = ConfigDict(extra="allow")

    valid: _Metrics
    test: dict[str, Any]
    popularity_valid: _Metrics | None = None


class _BundleMeta(BaseModel):
    """What the program reads of a bundle.json."""

    model_config = ConfigDict(extra="allow")

    name: str
    created: str
    metrics: _BundleMetrics


class BundleError(RecsysError):
    """The bundle to serve cannot be found or read; the message says what to fix."""


class Bundle:
    """A bundle directory, checked on opening (it holds bundle.json)."""

    def __init__(self, path: Path) -> None:
        if not (path / BUNDLE_FILE).is_file():
            raise BundleError(
                f"{path} is not a model bundle (no {BUNDLE_FILE}). Fix: pass WORK/bundles/NAME of `recsys pipeline run`"
            )
        self.path = path

    @cached_property
    def meta(self) -> dict[str, Any]:
        """The contents of bundle.json; `DataError` naming the file when it is not JSON (cut short) or lacks what is
        read of it (name, creation time, validation NDCG@10)."""
        return read_json_shaped(self.path / BUNDLE_FILE, _BundleMeta, "a bundle's bundle.json", REASSEMBLE)

    @property
    def version(self) -> str:
        """What the served model calls itself: the bundle's name and creation time."""
        return f"{self.meta['name']}@{self.meta['created']}"

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    @property
    def catalogue_file(self) -> Path:
        """The items and users' histories it serves (`recsys.artifacts.catalogue`)."""
        catalogue = self.path / CATALOGUE_FILE
        if not catalogue.is_file():
            raise BundleError(
                f"{self.path} holds no {CATALOGUE_FILE}: it was assembled by an earlier version of recsys. Fix: run "
                "the pipeline's register step again with this version (`recsys pipeline run --rerun register`)"
            )
        return catalogue

    @property
    def index_dir(self) -> Path | None:
        index = self.path / "index"
        return index if index.is_dir() else None

    @property
    def validation_ndcg_at_10(self) -> float:
        """The champion gate's metric."""
        return float(self.meta["metrics"]["valid"]["ndcg@10"])

    @property
    def popularity_validation_ndcg_at_10(self) -> float | None:
        """The popularity baseline's validation NDCG@10 on the model's data: the bar of the champion gate (None in
        bundles of models trained before it was measured)."""
        baseline = self.meta["metrics"].get(POPULARITY_VALID)
        return None if baseline is None else float(baseline["ndcg@10"])

    def content_sha256(self) -> str:
        """SHA-256 of what the bundle holds, the same for two assemblies of the same inputs: every file by its path and
        bytes, except bundle.json, read without its creation time, and the catalogue, read by its arrays (`np.savez`
        stamps the time into its zip). What identifies a registration of it (`pipelines.registry`)."""
        digest = hashlib.sha256()
        for path in sorted(p for p in self.path.rglob("*") if p.is_file()):
            relative = path.relative_to(self.path).as_posix()
            if relative == BUNDLE_FILE:
                meta = {key: value for key, value in self.meta.items() if key != "created"}
                content = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()
            elif relative == CATALOGUE_FILE:
                content = _members_sha256(path)
            else:
                with path.open("rb") as f:
                    content = hashlib.file_digest(f, "sha256").hexdigest()
            digest.update(f"{relative}\0{content}\n".encode())
        return digest.hexdigest()

    @staticmethod
    def write(
        out_dir: Path,
        *,
        name: str,
        model_dir: Path,
        index_dir: Path | None = None,
        semantic_ids: Path | None = None,
        source: dict[str, Any] | None = None,
    ) -> Bundle:
        """Assemble the bundle of `model_dir` (the catalogue and histories of its training data, its index and
        semantic IDs when given) in `out_dir`, atomically."""
        metrics = read_metrics(model_dir)
        with atomic_directory(out_dir, marker=BUNDLE_FILE) as tmp:
            shutil.copytree(model_dir, tmp / "model")
            write_catalogue(tmp / CATALOGUE_FILE, trained_data(model_dir))
            if index_dir is not None:
                shutil.copytree(index_dir, tmp / "index")
            if semantic_ids is not None:
                shutil.copyfile(semantic_ids, tmp / semantic_ids.name)
            meta = {
                "name": name,
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
                "metrics": {
                    "valid": metrics["valid"],
                    "test": metrics["test"],
                    POPULARITY_VALID: metrics.get(POPULARITY_VALID),  # None: trained before it was measured
                },
                "has_index": index_dir is not None,
                "has_semantic_ids": semantic_ids is not None,
                "source": source or {},
            }
            (tmp / BUNDLE_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return Bundle(out_dir)


def _members_sha256(path: Path) -> str:
    """SHA-256 of a zip file's members, names and contents, whatever times it records."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(path) as archive:
        for name in sorted(archive.namelist()):
            content = hashlib.sha256()
            with archive.open(name) as member:
                while chunk := member.read(1 << 20):
                    content.update(chunk)
            digest.update(f"{name}\0{content.hexdigest()}\n".encode())
    return digest.hexdigest()
