"""Items added at run time (`POST /v1/admin/items`), kept in one JSON file so that a restart or a hot swap serves them
again, until a trained bundle's catalogue holds them.

The file is rewritten atomically on every add; on every load of a bundle (start-up, hot swap) the items its catalogue
lacks are placed by the new model (`serving.loading`) and those it holds are dropped from the file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from recsys.runtime.atomic import atomic_file

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1


@dataclass(frozen=True)
class NewItem:
    """An item the trained model never saw: its id, its title, and any other text columns the catalogue's text is
    made of (`content.text_fields`, e.g. `llm_category`, `brand`)."""

    item_id: str
    title: str
    fields: dict[str, str] = field(default_factory=dict)


class AddedItemStore:
    """The run-time items of one server, in `path` ({"version": 1, "items": [...]}, oldest first)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[NewItem]:
        """The kept items (none when the file does not exist yet). A file this code cannot read is an error naming
        it: silently serving without the items would lose them at the next write."""
        if not self.path.exists():
            return []
        try:
            record = json.loads(self.path.read_text())
            if record.get("version") != FORMAT_VERSION:
                raise ValueError(f"format version {record.get('version')!r}, expected {FORMAT_VERSION}")
            return [NewItem(i["item_id"], i["title"], dict(i.get("fields", {}))) for i in record["items"]]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(
                f"{self.path}: not a file of run-time items ({type(err).__name__}: {err}). Fix: restore it, or move "
                "it away to start without the items it held"
            ) from err

    def save(self, items: Iterable[NewItem]) -> None:
        with atomic_file(self.path) as tmp:
            tmp.write_text(json.dumps({"version": FORMAT_VERSION, "items": [asdict(i) for i in items]}, indent=1))


def merged(kept: list[NewItem], added: list[NewItem]) -> list[NewItem]:
    """`kept` with `added` applied: an id added again replaces its earlier version in place (an add is idempotent),
    new ids come last."""
    by_id = {item.item_id: item for item in kept}
    by_id.update((item.item_id, item) for item in added)
    return list(by_id.values())
