"""Items added at run time (`POST /v1/admin/items`), kept in one JSON file so that every bundle served later (a
restart, a hot swap, a rollback) serves them again.

    FILE                  {"version": 1, "items": [{"item_id", "title", "fields": {name: text}}, ...]}, oldest first
    FILE.embeddings/      their texts' encoder vectors (`recsys.semantic_ids.content`'s cache, keyed by the text and
                          the encoder): a restart or a swap embeds only the texts it has not seen

An acknowledged item stays in the file: a bundle whose catalogue holds it serves it from its catalogue, any other
(the bundle it was added under, after a rollback) places it by its text again (`serving.loading`). The file is
rewritten atomically on every add and on nothing else; every entry is checked when it is read, as a request's items
are when they are added (`NewItem`), so a file edited by hand is refused with the entry and the fix, never served
half.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pydantic_core

from recsys.data.schema import MAX_ID_CHARS
from recsys.errors import DataError
from recsys.runtime.atomic import atomic_file, remove_temporaries

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MAX_TEXT_CHARS = 2_000  # one text of an item: a title, a description (the encoder reads ~256 tokens)
MAX_FIELDS = 16
FIELD_NAME = r"^[a-z][a-z0-9_]{0,63}$"  # an item column, e.g. llm_category
SPARE_BYTES = 1 << 20  # free space an add needs beyond a copy of the file and its vectors (a request's items)


@dataclass(frozen=True)
class NewItem:
    """An item the trained model never saw: its id, its title, and any other text columns the catalogue's text is
    made of (`content.text_fields`, e.g. `llm_category`, `brand`). Checked when made: ValueError saying what is wrong.

    Example:
        >>> NewItem("n1", "Red lipstick", {"llm_category": "Beauty > Lips"}).title
        'Red lipstick'
        >>> NewItem("n1", None)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: title is null, expected a text of 1-2000 characters, not all blank
    """

    item_id: str
    title: str
    fields: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.item_id, str) or not 1 <= len(self.item_id) <= MAX_ID_CHARS:
            raise ValueError(f"item_id is {_described(self.item_id)}, expected a text of 1-{MAX_ID_CHARS} characters")
        _check_text("title", self.title)
        if not isinstance(self.fields, dict) or len(self.fields) > MAX_FIELDS:
            raise ValueError(f"fields is {_described(self.fields)}, expected an object of at most {MAX_FIELDS} texts")
        for name, text in self.fields.items():
            if not isinstance(name, str) or not re.match(FIELD_NAME, name):
                raise ValueError(f"field name {name!r} is not a column name (lowercase letters, digits, _)")
            _check_text(f"fields.{name}", text)

    @staticmethod
    def of_record(record: Any) -> NewItem:
        """The item of one entry of the file (a JSON object); ValueError saying what is wrong."""
        if not isinstance(record, dict):
            raise ValueError(f"the entry is {_described(record)}, expected an object with item_id and title")
        unknown = set(record) - {"item_id", "title", "fields"}
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}: an entry has item_id, title and fields")
        if "item_id" not in record or "title" not in record:
            raise ValueError("item_id or title is missing")
        return NewItem(record["item_id"], record["title"], record.get("fields", {}))


def _check_text(name: str, text: object) -> None:
    if not isinstance(text, str) or not 1 <= len(text) <= MAX_TEXT_CHARS or not text.strip():
        raise ValueError(
            f"{name} is {_described(text)}, expected a text of 1-{MAX_TEXT_CHARS} characters, not all blank"
        )


def _described(value: object) -> str:
    """A value as an error names it: its JSON type, and a short text itself (never a long one)."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"a text of {len(value)} characters" if len(value) > 40 or not value.strip() else repr(value)
    kinds = {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "an object"}
    return kinds.get(type(value), type(value).__name__)


class AddedItemStore:
    """The run-time items of one server, in `path` (the module docstring's format)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def embeddings_dir(self) -> Path:
        """Where the items' encoder vectors are cached, beside the file."""
        return self.path.with_name(self.path.name + ".embeddings")

    def load(self) -> list[NewItem]:
        """The kept items (none when the file does not exist yet). A file or an entry this code cannot read is a
        `DataError` naming the file, the entry and the fix: serving without the items would lose them at the next
        write."""
        if not self.path.exists():
            return []
        try:
            record = pydantic_core.from_json(
                self.path.read_bytes()
            )  # refuses text that is not Unicode (a lone "\ud800")
            if not isinstance(record, dict) or record.get("version") != FORMAT_VERSION:
                version = record.get("version") if isinstance(record, dict) else None
                raise ValueError(f"format version {version!r}, expected {FORMAT_VERSION}")
            entries = record["items"]
            if not isinstance(entries, list):
                raise ValueError(f"items is {_described(entries)}, expected a list")
        except (OSError, ValueError, KeyError) as err:
            raise DataError(
                self.path, f"not a file of run-time items ({type(err).__name__}: {err})",
                "restore it, or move it away to start without the items it held",
            ) from err  # fmt: skip
        items = []
        for n, entry in enumerate(entries):
            try:
                items.append(NewItem.of_record(entry))
            except ValueError as err:
                named = (
                    f" ({entry['item_id']!r})"
                    if isinstance(entry, dict) and isinstance(entry.get("item_id"), str)
                    else ""
                )
                raise DataError(
                    self.path, f"items[{n}]{named}: {err}",
                    "correct or remove that entry (each is {\"item_id\": text, \"title\": text, \"fields\": {name: "
                    "text}}, as POST /v1/admin/items takes them)",
                ) from err  # fmt: skip
        return items

    def save(self, items: Iterable[NewItem]) -> None:
        """Rewrite the file with `items`, atomically; OSError when it cannot be written (the file is then unchanged)."""
        with atomic_file(self.path) as tmp:
            tmp.write_text(json.dumps({"version": FORMAT_VERSION, "items": [asdict(i) for i in items]}, indent=1))

    def remove_leftovers(self) -> list[Path]:
        """Remove the temporaries a killed write left beside the file and in its vectors' cache; returns them. Call it
        only where no write to them can be under way (a server's start, with one worker)."""
        found = remove_temporaries(self.path.parent, self.path.name)
        for folder in sorted(p for p in self.embeddings_dir.glob("*") if p.is_dir()):
            found += remove_temporaries(folder)
        return found

    def unwritable(self) -> str | None:
        """Why the file can never be written here, or None: its directory is missing or not writable (a read-only
        file system too)."""
        folder = self.path.parent
        if not folder.is_dir():
            return f"{folder} is not a directory"
        if not os.access(folder, os.W_OK):  # EROFS on a read-only file system, for root too
            return f"{folder} is not writable"
        return None

    def write_problem(self) -> str | None:
        """Why an add could not be kept now, or None: `unwritable`, or its disk has less free space than a copy of the
        file and its vectors (an add rewrites them beside the old ones) and a request's items."""
        problem = self.unwritable()
        if problem is not None:
            return problem
        needed = SPARE_BYTES + _size(self.path) + sum(_size(p) for p in self.embeddings_dir.rglob("*"))
        free = shutil.disk_usage(self.path.parent).free
        return (
            f"{self.path.parent} has {free >> 10} KiB free, an add needs {needed >> 10} KiB" if free < needed else None
        )


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def merged(kept: list[NewItem], added: list[NewItem]) -> list[NewItem]:
    """`kept` with `added` applied: an id added again replaces its earlier version in place (an add is idempotent),
    new ids come last."""
    by_id = {item.item_id: item for item in kept}
    by_id.update((item.item_id, item) for item in added)
    return list(by_id.values())
