"""`recsys data ...`: load a raw source, apply the data policies, and write (prepare) or report (validate).

Examples:
    recsys data prepare --source amazon-p5 --input ../shared/data/amazon-beauty --out data/beauty
    recsys data prepare --source synthetic --num-users 500 --num-items 200 --out data/synthetic
    recsys data validate --source movielens --input ml-1m/
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cli.common import handle_errors
from features.attributes import AttributeFiles
from features.prepare import PrepareSummary, dry_run, prepare
from features.raw import RawDataset, RawStream
from features.settings import DEFAULT_MEMORY_BUDGET_GB, PrepareSettings, UnknownItems
from features.sources import SOURCES, get_source, open_source
from recsys.data.splits import MIN_INTERACTIONS

app = typer.Typer(help="Prepare and validate interaction data.", no_args_is_help=True)

SourceOpt = Annotated[str, typer.Option("--source", help=f"Data source: {', '.join(SOURCES)}.")]
InputOpt = Annotated[
    Path | None, typer.Option("--input", help="File or directory to read (every source but synthetic).")
]
MinInteractionsOpt = Annotated[
    int, typer.Option("--min-interactions", help="Drop users with fewer interactions (>= 3).")
]
UnknownItemsOpt = Annotated[
    UnknownItems, typer.Option("--unknown-items", help="Interactions with items absent from the catalog.")
]
ColdOpt = Annotated[
    float, typer.Option("--cold-start-fraction", help="Share of items marked cold (held out of training).")
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the cold-item draw (and of the synthetic data).")]
NumUsersOpt = Annotated[int | None, typer.Option("--num-users", help="synthetic only: number of users.")]
NumItemsOpt = Annotated[int | None, typer.Option("--num-items", help="synthetic only: number of items.")]
MemoryBudgetOpt = Annotated[
    float,
    typer.Option(
        "--memory-budget-gb",
        help="Memory the work may use (GiB): it sizes the batches large inputs are read in, and the process stops "
        "with an error when its resident memory grows past it; the output is the same.",
    ),
]
CategoriesOpt = Annotated[
    Path | None,
    typer.Option("--categories", help="CSV item_id,categories of item category paths (relative: under --input)."),
]
NamesOpt = Annotated[
    Path | None, typer.Option("--names", help="CSV item_id,name of short item names (relative: under --input).")
]
MaxSecondsOpt = Annotated[
    float | None,
    typer.Option(
        "--max-seconds", help="Stop with an error when the work runs longer (wall seconds); default: no bound."
    ),
]


@app.command("prepare")
def prepare_command(
    source: SourceOpt,
    out: Annotated[Path, typer.Option("--out", help="Prepared directory to write (replaced atomically).")],
    input_path: InputOpt = None,
    min_interactions: MinInteractionsOpt = MIN_INTERACTIONS,
    unknown_items: UnknownItemsOpt = UnknownItems.DROP,
    cold_start_fraction: ColdOpt = 0.0,
    seed: SeedOpt = 0,
    num_users: NumUsersOpt = None,
    num_items: NumItemsOpt = None,
    memory_budget_gb: MemoryBudgetOpt = DEFAULT_MEMORY_BUDGET_GB,
    max_seconds: MaxSecondsOpt = None,
    categories: CategoriesOpt = None,
    names: NamesOpt = None,
) -> None:
    """Load a source, apply the policies, join the item attribute files given, and write interactions/items/users
    parquet + meta.json."""
    with handle_errors():
        options = source_options(source, seed=seed, num_users=num_users, num_items=num_items)
        raw = open_source(source, input_path, **options)
        settings = PrepareSettings.checked(
            min_interactions=min_interactions, unknown_items=unknown_items, cold_start_fraction=cold_start_fraction,
            seed=seed, memory_budget_gb=memory_budget_gb, max_seconds=max_seconds,
        )  # fmt: skip
        files = AttributeFiles(categories=categories, names=names)
        attributes = files.resolved(input_path) if files.named() else None
        summary = prepare(raw, out, settings, source_options=options, attributes=attributes)
    print_summary(summary, raw)


@app.command("validate")
def validate_command(
    source: SourceOpt,
    input_path: InputOpt = None,
    min_interactions: MinInteractionsOpt = MIN_INTERACTIONS,
    unknown_items: UnknownItemsOpt = UnknownItems.DROP,
    cold_start_fraction: ColdOpt = 0.0,
    seed: SeedOpt = 0,
    num_users: NumUsersOpt = None,
    num_items: NumItemsOpt = None,
    memory_budget_gb: MemoryBudgetOpt = DEFAULT_MEMORY_BUDGET_GB,
    max_seconds: MaxSecondsOpt = None,
) -> None:
    """Load a source and apply the policies like `prepare`, but write nothing: report counts and policies."""
    with handle_errors():
        options = source_options(source, seed=seed, num_users=num_users, num_items=num_items)
        raw = open_source(source, input_path, **options)
        settings = PrepareSettings.checked(
            min_interactions=min_interactions, unknown_items=unknown_items, cold_start_fraction=cold_start_fraction,
            seed=seed, memory_budget_gb=memory_budget_gb, max_seconds=max_seconds,
        )  # fmt: skip
        summary = dry_run(raw, settings)
    print_summary(summary, raw)


def source_options(source: str, *, seed: int, num_users: int | None, num_items: int | None) -> dict[str, Any]:
    """The loader options given on the command line; `seed` goes to sources that take one (synthetic).

    Args:
        source: the source name (unknown names raise `ConfigError`).
        seed: the --seed value.
        num_users: --num-users, or None.
        num_items: --num-items, or None.
    """
    options: dict[str, Any] = {"num_users": num_users, "num_items": num_items}
    if "seed" in get_source(source).options():
        options["seed"] = seed
    return {key: value for key, value in options.items() if value is not None}


def print_summary(summary: PrepareSummary, raw: RawDataset | RawStream) -> None:
    """Print counts and policies as two small tables.

    Args:
        summary: what prepare/validate produced.
        raw: the loaded dataset (for the input files).
    """
    console = Console()
    console.print(f"[bold]{summary.source}[/bold] from {', '.join(str(p) for p in raw.files) or 'the generator'}")
    counts = Table(title="counts")
    counts.add_column("what")
    counts.add_column("loaded", justify="right")
    counts.add_column("kept", justify="right")
    loaded = summary.loaded
    counts.add_row("interactions", f"{loaded.interactions:,}", f"{summary.num_interactions:,}")
    counts.add_row("users", f"{loaded.users:,}", f"{summary.num_users:,}")
    counts.add_row("items", f"{loaded.items:,}", f"{summary.num_items:,}")
    for split, count in summary.split_counts.items():
        counts.add_row(f"  {split}", "", f"{count:,}")
    counts.add_row("cold items", "", f"{summary.num_cold_items:,}")
    policies = Table(title="policies applied")
    for column in ("policy", "setting", "count", "detail"):
        policies.add_column(column, justify="right" if column == "count" else "left")
    for outcome in summary.policies:
        policies.add_row(outcome.name, outcome.setting, f"{outcome.count:,}", outcome.detail)
    console.print(counts)
    console.print(policies)
    if summary.out_dir is not None:
        console.print(f"wrote {summary.out_dir}")
    else:
        console.print("validated: nothing written")
