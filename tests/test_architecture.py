"""The floors of the house: every import points down (or sideways within a package), never back up.

Top level, from the ground up: `recsys` (the library) < `features` < `pipelines`; `serving` stands on the library
alone (it reads bundles and the registry through `recsys.artifacts`); `cli`, `dags` and `benchmarks` sit on top and
may use any floor below them. Inside `recsys`, the sub-packages are floors of their own
(`RECSYS_FLOORS`). Imports inside functions and under `TYPE_CHECKING` count too: a lazy import is still an arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# package -> the first-party packages it may import besides itself
MAY_IMPORT: dict[str, frozenset[str]] = {
    "recsys": frozenset(),
    "features": frozenset({"recsys"}),
    "pipelines": frozenset({"recsys", "features"}),
    "serving": frozenset({"recsys"}),
    "dags": frozenset({"recsys", "features", "pipelines"}),
    "cli": frozenset({"recsys", "features", "pipelines", "serving"}),
    "benchmarks": frozenset({"recsys", "features", "pipelines", "serving"}),
}
# inside recsys, from the ground up: a module may import its own floor and the floors below it
RECSYS_FLOORS = (
    "errors",
    "ordering",
    "runtime",
    "data",
    "enrich",
    "ops",
    "modules",
    "semantic_ids",
    "retrieval",
    "models",
    "inference",
    "evaluation",
    "training",
    "artifacts",
    "dashboard",
)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def first_party_imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, imported module or name) of every import of a first-party package in `path`, lazy ones included."""
    me = module_name(path, root)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name.split(".")[0] in MAY_IMPORT]


def arrow_runs_back_up(importer: str, imported: str) -> bool:
    """Whether `importer` (a dotted module) importing `imported` (a dotted name) points to a floor above it."""
    mine, theirs = importer.split("."), imported.split(".")
    if mine[0] != theirs[0]:
        return theirs[0] not in MAY_IMPORT[mine[0]]
    if mine[0] != "recsys" or len(mine) < 2 or len(theirs) < 2:
        return False
    floor = {name: i for i, name in enumerate(RECSYS_FLOORS)}
    if mine[1] not in floor or theirs[1] not in floor:
        raise AssertionError(f"{importer} or {imported} is in no floor of recsys: add it to RECSYS_FLOORS")
    return floor[theirs[1]] > floor[mine[1]]


def back_up_arrows(root: Path = ROOT) -> list[str]:
    """Every import that runs back up a floor, as 'file:line importer -> imported'."""
    arrows = []
    for package in MAY_IMPORT:
        for path in sorted((root / package).rglob("*.py")):
            importer = module_name(path, root)
            for line, imported in first_party_imports(path, root):
                if arrow_runs_back_up(importer, imported):
                    arrows.append(f"{path.relative_to(root)}:{line} {importer} -> {imported}")
    return arrows


def test_no_import_runs_back_up_a_floor() -> None:
    arrows = back_up_arrows()
    assert not arrows, "imports that run back up a floor (move the code down, or the import up):\n" + "\n".join(arrows)


def test_the_check_sees_an_arrow_back_up(tmp_path: Path) -> None:
    (tmp_path / "recsys" / "data").mkdir(parents=True)
    (tmp_path / "recsys" / "data" / "x.py").write_text("def f():\n    from recsys.training import trainer\n")
    (tmp_path / "features").mkdir()
    (tmp_path / "features" / "y.py").write_text("from pipelines.config import load_config\nfrom recsys.data import x\n")
    assert sorted(back_up_arrows(tmp_path)) == [
        "features/y.py:1 features.y -> pipelines.config.load_config",
        "recsys/data/x.py:2 recsys.data.x -> recsys.training.trainer",
    ]
