"""Per-user ranks of one evaluation on disk: what pairs two models' evaluations user by user
(`recsys.artifacts.comparison`, the champion gate).

One .npz file (no pickles):

    ranks               (U,) int64 0-based rank of each user's target, in the split's user order
    user_idx            (U,) int64 the users
    targets             (U,) int64 their held-out items
    slice.<family>      (U,) int16 index of the user's slice in the family's list, -1 in none (evaluations only)
    slice_names.<family>  (S,) str the family's slice names, in that order

The split digest (SHA-256 of user_idx and targets) says whether two evaluations ranked the same users' same targets.
Evaluations keep it as per_user.npz beside evaluation.json; model directories as valid_ranks.npz (the validation split,
for the champion gate: `recsys.artifacts.model_dir.VALID_RANKS_FILE`). The evaluation of a model that reads queries also
keeps search_ranks.npz: per search level, setting and system, the test users it ranked (`rows|<key>`, indices into the
split's users) and their targets' ranks (`ranks|<key>`).
"""

from __future__ import annotations

import hashlib
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from recsys.data.prepared import EvalSplit
from recsys.errors import DataError, RecsysError
from recsys.evaluation.slices import SliceMasks, slice_codes

PER_USER_FILE = "per_user.npz"  # of an evaluation directory
SEARCH_RANKS_FILE = "search_ranks.npz"  # of the evaluation directory of a model that reads queries
SLICE, SLICE_NAMES = "slice.", "slice_names."


@dataclass(frozen=True)
class PerUserRanks:
    """Each user's target rank on one split, with the users, their targets and their slices."""

    ranks: torch.Tensor  # (U,) int64
    user_idx: torch.Tensor  # (U,) int64
    targets: torch.Tensor  # (U,) int64
    slices: dict[str, tuple[list[str], torch.Tensor]] = field(default_factory=dict)  # family -> (names, (U,) int16)

    @staticmethod
    def of(
        ranks: torch.Tensor,
        split: EvalSplit,
        families: dict[str, SliceMasks] | None = None,
        rows: torch.Tensor | None = None,
    ) -> PerUserRanks:
        """The ranks of an evaluation of `split`'s users (of its `rows` only: a sample's, `UserSample.rows`), with the
        slice families (masks over every user of the split) it was sliced by."""
        rows = torch.arange(len(split.targets)) if rows is None else rows
        slices = {family: (list(masks), slice_codes({name: mask[rows] for name, mask in masks.items()}))
                  for family, masks in (families or {}).items()}  # fmt: skip
        return PerUserRanks(ranks.long(), split.user_idx[rows].long(), split.targets[rows].long(), slices)

    @property
    def split_digest(self) -> str:
        """SHA-256 of the users and their targets: equal for two evaluations of the same users' same targets."""
        digest = hashlib.sha256(self.user_idx.numpy().astype("<i8").tobytes())
        digest.update(self.targets.numpy().astype("<i8").tobytes())
        return digest.hexdigest()

    def slice_masks(self, family: str) -> SliceMasks:
        """The family's masks back from the codes: name -> (U,) bool."""
        names, codes = self.slices[family]
        return {name: codes == index for index, name in enumerate(names)}

    def write(self, path: Path) -> None:
        """Write the .npz (inside the caller's atomic directory: this is not atomic on its own)."""
        arrays = {"ranks": self.ranks.numpy(), "user_idx": self.user_idx.numpy(), "targets": self.targets.numpy()}
        for family, (names, codes) in self.slices.items():
            arrays[f"{SLICE}{family}"] = codes.numpy()
            arrays[f"{SLICE_NAMES}{family}"] = np.array(names, dtype=str)
        np.savez(path, **arrays)  # type: ignore[arg-type]

    @staticmethod
    def read(path: Path) -> PerUserRanks:
        """The ranks of a .npz `write` wrote; DataError naming the file for one that is not such a file (truncated,
        another file, arrays missing or of other lengths)."""
        if not path.is_file():
            raise RecsysError(f"{path}: no per-user ranks. Fix: re-run the step that writes it (its evaluation)")
        arrays = _read_npz(path)
        missing = [key for key in USER_ARRAYS if key not in arrays]
        missing += [SLICE_NAMES + key.removeprefix(SLICE) for key in arrays
                    if key.startswith(SLICE) and SLICE_NAMES + key.removeprefix(SLICE) not in arrays]  # fmt: skip
        if missing:
            raise DataError(path, f"lacks the arrays {missing} (it holds {sorted(arrays)})", _REWRITE)
        lengths = {key: arrays[key].shape for key in arrays if not key.startswith(SLICE_NAMES)}
        if any(shape != (len(arrays["ranks"]),) for shape in lengths.values()):
            raise DataError(path, f"its per-user arrays are not all of one length: shapes {lengths}", _REWRITE)
        if any(arrays[key].dtype.kind not in "iu" for key in lengths):
            raise DataError(path, f"holds arrays that are not integers: {_dtypes(arrays, lengths)}", _REWRITE)
        slices = {
            key.removeprefix(SLICE): ([str(n) for n in arrays[SLICE_NAMES + key.removeprefix(SLICE)]],
                                      torch.from_numpy(arrays[key]))
            for key in arrays
            if key.startswith(SLICE)
        }  # fmt: skip
        tensors = {key: torch.from_numpy(arrays[key]).long() for key in USER_ARRAYS}
        return PerUserRanks(slices=slices, **tensors)


USER_ARRAYS = ("ranks", "user_idx", "targets")
_REWRITE = "re-run the evaluation that wrote it (`recsys pipeline run --config CONFIG --rerun evaluate`)"


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of the .npz at `path`; DataError for a file that is not one (truncated, another format, pickles)."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != b"PK\x03\x04":  # an .npz is a zip archive
        raise DataError(path, f"not an .npz archive (a zip file): it starts with {head!r}", _REWRITE)
    try:
        stored = np.load(path, allow_pickle=False)
        if not isinstance(stored, np.lib.npyio.NpzFile):
            raise DataError(path, "holds one array (.npy), not the arrays of an .npz archive", _REWRITE)
        with stored:
            return {key: stored[key] for key in stored.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as err:  # not an .npz, cut short, pickles
        raise DataError(path, f"not a readable .npz archive ({type(err).__name__}: {str(err)[:200]})",
                        _REWRITE) from err  # fmt: skip


def _dtypes(arrays: dict[str, np.ndarray], keys: Iterable[str]) -> str:
    return ", ".join(f"{key} {arrays[key].dtype}" for key in keys)


SearchRanks = dict[str, tuple[torch.Tensor, torch.Tensor]]  # "<level>/<setting>/<system>" -> (rows, ranks)


def write_search_ranks(path: Path, ranks: SearchRanks) -> None:
    """Write search_ranks.npz (inside the caller's atomic directory)."""
    arrays = {}
    for key, (rows, values) in ranks.items():
        arrays[f"rows|{key}"], arrays[f"ranks|{key}"] = rows.numpy(), values.numpy()
    np.savez(path, **arrays)  # type: ignore[arg-type]


def read_search_ranks(path: Path) -> SearchRanks:
    if not path.is_file():
        raise RecsysError(f"{path}: no search ranks. Fix: evaluate the model that reads queries again")
    with np.load(path, allow_pickle=False) as stored:
        keys = [name.removeprefix("rows|") for name in stored.files if name.startswith("rows|")]
        return {key: (torch.from_numpy(stored[f"rows|{key}"]).long(), torch.from_numpy(stored[f"ranks|{key}"]).long())
                for key in keys}  # fmt: skip
