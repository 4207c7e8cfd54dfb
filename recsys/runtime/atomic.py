"""Atomic writes: a crash or an error never leaves a half-written file or directory behind.

A write goes to a temporary beside its target, named here and only here: `.NAME.XXXXXXXX.tmp` (`atomic_file`),
`.NAME.tmp-XXXXXXXX` (`atomic_directory`) and `.NAME.old-XXXXXXXX` (the directory it replaces, while it is swapped
out). An error removes them; a killed process cannot, so `remove_temporaries` finds what one left.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recsys.errors import DataError

# tempfile's names: the prefix and suffix given below around 8 characters of tempfile._RandomNameSequence
_TEMPORARY = re.compile(r"\.(?P<target>.+)\.(?:(?:tmp|old)-[a-z0-9_]{8}|[a-z0-9_]{8}\.tmp)")


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success it is renamed to `path`, on error removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode open() would have
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def atomic_directory(out_dir: Path, *, marker: str) -> Iterator[Path]:
    """Yield a temp directory beside `out_dir`; on success it replaces `out_dir`, on error it is removed.

    An existing `out_dir` is only replaced if it is empty or holds `marker` (i.e. it was written by
    this tool), so a mistyped --out cannot wipe an unrelated directory. The swap is two renames on one
    file system: readers see the old directory or the new one, never a half-written one.

    Args:
        out_dir: the final directory.
        marker: a file name that identifies a directory this tool may replace, e.g. "meta.json".
    """
    if out_dir.exists() and not (out_dir.is_dir() and (not any(out_dir.iterdir()) or (out_dir / marker).exists())):
        raise DataError(
            out_dir,
            f"exists and is not an output of this tool (no {marker})",
            "choose another --out, or remove it yourself",
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        os.chmod(tmp, 0o755)
        yield tmp
        _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_in(tmp: Path, out_dir: Path) -> None:
    """Rename `tmp` to `out_dir`, moving an existing `out_dir` aside first and deleting it afterwards."""
    if not out_dir.exists():
        tmp.rename(out_dir)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    old.rmdir()
    out_dir.rename(old)
    try:
        tmp.rename(out_dir)
    except OSError:
        old.rename(out_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)


def remove_temporaries(directory: Path, target: str = "*") -> list[Path]:
    """Remove the temporaries of atomic writes in `directory` whose target's name matches the glob `target`; returns
    what it removed.

    Outside a write, they are what a killed process left behind: call this only where no write can be under way
    (e.g. holding the lock of the pipeline that owns the directory).
    """
    if not directory.is_dir():
        return []
    found = sorted(
        path
        for path in directory.iterdir()
        if (match := _TEMPORARY.fullmatch(path.name)) and fnmatch.fnmatchcase(match["target"], target)
    )
    for path in found:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    return found
