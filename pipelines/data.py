"""Pipeline step: raw source -> prepared directory, skipped when its inputs did not change."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from features.attributes import AttributeFiles
from features.prepare import prepare
from features.sources import open_source
from pipelines.config import DataSection
from recsys.data.schema import META_FILE
from recsys.errors import DataError
from recsys.runtime.atomic import atomic_file
from recsys.runtime.digest import feed_file
from recsys.runtime.json_files import read_json

logger = logging.getLogger(__name__)

FINGERPRINT_FILE = "fingerprint.json"


def prepare_step(section: DataSection, out_dir: Path) -> Path:
    """Prepare `section`'s data into `out_dir` unless a previous run did it with the same inputs.

    Idempotent: the fingerprint (settings + content hash of the input files) is stored beside the
    prepared files; the directory itself is replaced atomically by `features.prepare.prepare`.
    """
    fingerprint = data_fingerprint(section)
    stored = out_dir / FINGERPRINT_FILE
    if (out_dir / META_FILE).is_file() and stored.is_file() and _stored_fingerprint(stored) == fingerprint:
        logger.info("data in %s is up to date; skipping prepare", out_dir)
        return out_dir
    raw = open_source(section.source, section.path, **section.options)
    prepare(raw, out_dir, section.prepare_settings(), source_options=section.options, attributes=attributes_of(section))
    with atomic_file(stored) as tmp:
        tmp.write_text(json.dumps(fingerprint, indent=1, sort_keys=True))
    return out_dir


def _stored_fingerprint(stored: Path) -> Any:
    """The fingerprint a previous preparation stored; None (prepared again) when it does not read: cut short, not
    JSON."""
    try:
        return read_json(stored, "none needed")
    except DataError as err:
        logger.warning("%s: %s: the data is prepared again", err.path, err.problem)
        return None


def attributes_of(section: DataSection) -> AttributeFiles | None:
    """The section's attribute files with their paths resolved, or None when it names none."""
    files = section.attribute_files()
    return files if files.named() else None


def data_fingerprint(section: DataSection) -> dict[str, str]:
    """The settings and a sha256 over the input files' names and bytes, the attribute files' included (wherever they
    are: a changed one prepares the data again)."""
    digest = hashlib.sha256()
    files: list[Path] = []
    if section.path is not None:
        files = sorted(p for p in section.path.rglob("*") if p.is_file()) if section.path.is_dir() else [section.path]
    attributes = section.attribute_files().named()
    for file in [*files, *attributes.values()]:
        digest.update(file.name.encode())
        if not file.is_file():
            digest.update(b"<missing>")
            continue
        feed_file(digest, file)
    # the domain selects what trains, the budgets how the work is cut: none of them changes what is prepared; no
    # attribute files leave the settings as they were before attributes existed (nothing is prepared again)
    unchanged = {"domain", *section.HOW_IT_RUNS, *(() if attributes else ("attributes",))}
    settings = section.model_dump_json(exclude=unchanged)
    return {"settings": settings, "inputs_sha256": digest.hexdigest()}
