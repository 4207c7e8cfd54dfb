"""The laboratory beside the product, not inside it: no product code or product config reads a result or a config of
the laboratory (`benchmarks/`), nor imports it. The laboratory may use the product; the product runs without it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("recsys", "features", "pipelines", "serving", "cli", "dags", "configs", "pyproject.toml", "Makefile")
SUFFIXES = {".py", ".yaml", ".yml", ".toml", ".json", ".md", ".txt", ".cfg", ".html", ".j2"}
# what names the laboratory's files or code (a `python -m benchmarks.X` command line names a module to run, not a
# file the product reads: the Makefile's bench target and a config's `# Command:` header do that)
LAB = re.compile(r"benchmarks/results|benchmarks/configs|configs/benchmarks|^\s*(?:import|from) benchmarks\b")


def lab_references(root: Path, parts: tuple[str, ...] = PRODUCT) -> Iterator[str]:
    """`path:line: text` of every line of the product's files under `root` that names the laboratory."""
    for part in parts:
        top = root / part
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in files:
            if path.is_file() and (path.suffix in SUFFIXES or path.name == "Makefile"):
                for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    if LAB.search(line):
                        yield f"{path.relative_to(root)}:{number}: {line.strip()}"


def test_no_product_file_reads_or_imports_the_laboratory() -> None:
    found = list(lab_references(ROOT))
    assert not found, "the product names the laboratory (benchmarks/); move it to the lab:\n" + "\n".join(found)


def test_the_check_finds_a_planted_reference(tmp_path: Path) -> None:
    (tmp_path / "configs" / "beauty").mkdir(parents=True)
    (tmp_path / "configs" / "beauty" / "x.yaml").write_text("enrich:\n  records: benchmarks/results/meta.parquet\n")
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "a.py").write_text('"""Doc."""\n\nfrom benchmarks.common import REPO\n')
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "ok.py").write_text('RUN = "python -m benchmarks.quality --config configs/beauty/x.yaml"\n')
    (tmp_path / "Makefile").write_text("bench:\n\tpython -m benchmarks.quality --config benchmarks/configs/y.yaml\n")
    assert list(lab_references(tmp_path, ("configs", "pipelines", "cli", "Makefile", "absent"))) == [
        "configs/beauty/x.yaml:2: records: benchmarks/results/meta.parquet",
        "pipelines/a.py:3: from benchmarks.common import REPO",
        "Makefile:2: python -m benchmarks.quality --config benchmarks/configs/y.yaml",
    ]
