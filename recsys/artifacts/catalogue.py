"""The catalogue and the users' histories a bundle serves, in one numpy file (no pickles): what serving reads instead of
the prepared data the model was trained on, so a served bundle needs neither that directory nor a parquet reader.

    catalogue.npz
        item_id.utf8, item_id.offsets   item 1..V's id: the UTF-8 bytes of all of them, (V+1,) offsets into them
        title.utf8, title.offsets       its display title (its id where the title is empty)
        item_count                      (V+1,) how often it occurs in the training sequences (0 for the padding)
        user_id.utf8, user_id.offsets   U users' ids
        history.offsets                 (U+1,) where each user's interactions start in `history.items`
        history.items, history.ts       item_idx and unix seconds (or positions) of every interaction, oldest first

Written from the model's `SequenceData` when the bundle is assembled (`write_catalogue`); read whole, with numpy and
torch alone (`read_catalogue`).

Dimension letters: V items, U users, N interactions.
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from recsys.data.schema import ITEM_ID, USER_ID
from recsys.errors import RecsysError
from recsys.runtime.atomic import atomic_file

if TYPE_CHECKING:  # the writer's input; the reader needs no parquet reader
    from recsys.data.prepared import SequenceData

CATALOGUE_FILE = "catalogue.npz"


@dataclass(frozen=True)
class Utf8Strings:
    """Strings as one buffer of UTF-8 bytes and offsets into it (the jagged layout of `recsys.data.jagged`), decoded
    one at a time: a catalogue's titles stay a few bytes each until a response names them.

    Example:
        >>> names = Utf8Strings.of(["rouge", "", "crème"])
        >>> len(names), names[2], names.to_list()
        (3, 'crème', ['rouge', '', 'crème'])
    """

    utf8: np.ndarray  # (bytes,) uint8
    offsets: np.ndarray  # (n+1,) int64

    @staticmethod
    def of(strings: list[str]) -> Utf8Strings:
        encoded = [s.encode() for s in strings]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        return Utf8Strings(np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        return self.utf8[self.offsets[i] : self.offsets[i + 1]].tobytes().decode()

    def to_list(self) -> list[str]:
        whole = self.utf8.tobytes()
        return [whole[a:b].decode() for a, b in zip(self.offsets[:-1].tolist(), self.offsets[1:].tolist(), strict=True)]


@dataclass(frozen=True)
class Catalogue:
    """The items a bundle ranks: item_idx i (1..V) is `item_ids[i - 1]`."""

    item_ids: list[str]
    titles: Utf8Strings  # display titles of items 1..V
    item_counts: torch.Tensor  # (V+1,) training counts

    @property
    def num_items(self) -> int:
        return len(self.item_ids)

    def title(self, item_idx: int) -> str:
        return self.titles[item_idx - 1]


@dataclass(frozen=True)
class UserHistories:
    """The users a bundle knows and every interaction of theirs in its data, oldest first."""

    user_ids: list[str]
    offsets: list[int]  # (U+1,) plain ints: slicing tensors with tensor offsets costs ~0.2 ms per request
    items: torch.Tensor  # (N,) item_idx
    times: torch.Tensor  # (N,) unix seconds, or positions for data without times
    _rows: dict[str, int] = field(init=False, repr=False, compare=False)  # user_id -> its row

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rows", {user_id: row for row, user_id in enumerate(self.user_ids)})

    def user_idx(self, user_id: str) -> int:
        """The user's index in the model's data (row + 1: what a model's user token reads), 0 for a user the bundle
        does not know (the unknown user's token)."""
        row = self._rows.get(user_id)
        return 0 if row is None else row + 1

    def of(self, user_id: str) -> tuple[list[int], list[int]] | None:
        """(item_idx, times) of the user's interactions, or None for a user the bundle does not know."""
        row = self._rows.get(user_id)
        if row is None:
            return None
        start, end = self.offsets[row], self.offsets[row + 1]
        return self.items[start:end].tolist(), self.times[start:end].tolist()


def write_catalogue(path: Path, data: SequenceData) -> None:
    """Write the catalogue and histories of `data` (the model's training data) to `path`, atomically."""
    item_ids = data.items[ITEM_ID].cast(str).to_list()
    titles = data.titles(torch.arange(1, data.num_items + 1))
    arrays: dict[str, Any] = {
        **_strings("item_id", Utf8Strings.of(item_ids)),
        **_strings("title", Utf8Strings.of(titles)),
        "item_count": data.item_counts().numpy(),
        **_strings("user_id", Utf8Strings.of(data.users[USER_ID].cast(str).to_list())),
        "history.offsets": data.sequences.offsets.numpy(),
        "history.items": data.sequences.values.numpy(),
        "history.ts": data.timestamps.values.numpy(),
    }
    with atomic_file(path) as tmp, tmp.open("wb") as f:
        np.savez(f, **arrays)


def read_catalogue(path: Path) -> tuple[Catalogue, UserHistories]:
    """The catalogue and histories written at `path`; `RecsysError` naming the file when it cannot be read."""
    try:
        with np.load(path, allow_pickle=False) as arrays:
            item_ids = _read_strings(arrays, "item_id").to_list()
            catalogue = Catalogue(item_ids, _read_strings(arrays, "title"), torch.from_numpy(arrays["item_count"]))
            histories = UserHistories(
                _read_strings(arrays, "user_id").to_list(),
                arrays["history.offsets"].tolist(),
                torch.from_numpy(arrays["history.items"]),
                torch.from_numpy(arrays["history.ts"]),
            )
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:  # cut short, not .npz
        raise RecsysError(
            f"{path}: not a readable catalogue ({type(err).__name__}: {err}). Fix: assemble the bundle again (the "
            "pipeline's register step)"
        ) from err
    if len(catalogue.titles) != catalogue.num_items or len(catalogue.item_counts) != catalogue.num_items + 1:
        raise RecsysError(f"{path}: its item columns disagree in length. Fix: assemble the bundle again")
    return catalogue, histories


def _strings(name: str, strings: Utf8Strings) -> dict[str, np.ndarray]:
    return {f"{name}.utf8": strings.utf8, f"{name}.offsets": strings.offsets}


def _read_strings(arrays: np.lib.npyio.NpzFile, name: str) -> Utf8Strings:
    return Utf8Strings(arrays[f"{name}.utf8"], arrays[f"{name}.offsets"])
