"""What a process killed inside an atomic write leaves behind, and `remove_temporaries` finding exactly that."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from recsys.runtime.atomic import atomic_directory, atomic_file, remove_temporaries


def _killed_inside_writes(folder: Path) -> None:
    with atomic_directory(folder / "model", marker="model.pt") as tmp, atomic_file(folder / "state.json") as file:
        (tmp / "model.pt").write_text("half")
        file.write_text("{")
        os.kill(os.getpid(), signal.SIGKILL)


def test_remove_temporaries_removes_what_a_killed_write_left_and_nothing_else(tmp_path: Path) -> None:
    process = multiprocessing.get_context("fork").Process(target=_killed_inside_writes, args=(tmp_path,))
    process.start()
    process.join()
    assert process.exitcode == -signal.SIGKILL
    left = {p.name for p in tmp_path.iterdir()}
    assert len(left) == 2 and not {"model", "state.json"} & left  # a temporary of each write, never a final name
    kept = ["model", ".model.tmp-1", ".model.tmp-abcdefghi", ".other.txt", "state.json.abcdefgh.tmp"]
    for name in kept:  # the final directory, and names the atomic helpers do not make
        (tmp_path / name).touch()

    assert remove_temporaries(tmp_path, "other-*") == []
    (directory,) = remove_temporaries(tmp_path, "mod*")  # the glob is on the target's name
    assert directory.name.startswith(".model.tmp-") and not directory.exists()
    (file,) = remove_temporaries(tmp_path)
    assert file.name.startswith(".state.json.") and file.name.endswith(".tmp")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
    assert remove_temporaries(tmp_path / "missing") == []


@pytest.mark.parametrize("name", [".model.old-k3j_x9a0", ".model.tmp-k3j_x9a0", ".model.ab_12c3d.tmp"])
def test_every_kind_of_temporary_is_recognised(tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    assert [p.name for p in remove_temporaries(tmp_path, "model")] == [name]
