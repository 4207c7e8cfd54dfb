"""`recsys index build`: a trained retriever's item vectors -> a FAISS index, with its recall against exact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cli.common import handle_errors

app = typer.Typer(help="FAISS indexes of trained retrievers.", no_args_is_help=True)


@app.command("build")
def build_command(
    model_dir: Annotated[Path, typer.Option("--model-dir", help="A model directory written by `recsys train`.")],
    out: Annotated[Path, typer.Option("--out", help="The index directory to write (replaced atomically).")],
    kind: Annotated[str, typer.Option("--kind", help="flat, ivf_flat, hnsw or ivf_pq.")] = "ivf_flat",
    nlist: Annotated[int | None, typer.Option("--nlist", help="IVF cells (default 4 sqrt(V)).")] = None,
    nprobe: Annotated[int, typer.Option("--nprobe", help="IVF cells visited per query.")] = 32,
    hnsw_m: Annotated[int, typer.Option("--hnsw-m", help="HNSW graph degree.")] = 32,
    ef_search: Annotated[int, typer.Option("--ef-search", help="HNSW candidates per query.")] = 128,
    pq_m: Annotated[int, typer.Option("--pq-m", help="IVF-PQ sub-quantizers (must divide the dim).")] = 16,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or gpu.")] = "auto",
    eval_users: Annotated[
        int, typer.Option("--eval-users", min=1, help="Validation users for the recall check.")
    ] = 1_000,
) -> None:
    """Index the model's item vectors (kept as is when already built from the same model and settings)."""
    from pipelines.index import build_index_step
    from recsys.errors import ConfigError
    from recsys.retrieval import IndexConfig
    from recsys.retrieval.faiss_index import FaissTopK

    with handle_errors():
        try:  # bad settings (an unknown kind, pq_m not dividing the dim, no GPU) are the user's to fix
            config = IndexConfig(
                kind=kind, nlist=nlist, nprobe=nprobe, hnsw_m=hnsw_m, ef_search=ef_search, pq_m=pq_m, device=device,  # type: ignore[arg-type]
            )  # fmt: skip
            path = build_index_step(model_dir, out, config, eval_users)
        except ValueError as err:
            raise ConfigError(f"{err} (see `recsys index build --help`)") from err
        report = FaissTopK.read_report(path)
    table = Table(title=f"FAISS {kind} index of {model_dir}")
    table.add_column("statistic")
    table.add_column("value", justify="right")
    if report is not None:
        table.add_row("items", f"{report.num_items:,}")
        table.add_row("dim", str(report.dim))
        table.add_row("device", report.device)
        table.add_row(f"recall@{report.k} vs exact ({report.eval_queries} users)", f"{report.recall:.4f}")
        table.add_row("build seconds", f"{report.build_seconds:.2f}")
    Console().print(table)
    typer.echo(f"wrote {path}")
