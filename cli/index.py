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
    pq_nbits: Annotated[int, typer.Option("--pq-nbits", help="IVF-PQ bits per code (4 with --fast-scan).")] = 8,
    fast_scan: Annotated[
        bool, typer.Option("--fast-scan/--no-fast-scan", help="IVF-PQ: 4-bit SIMD fast-scan codes.")
    ] = False,
    refine_k_factor: Annotated[
        float | None,
        typer.Option("--refine-k-factor", help="IVF-PQ: re-rank k x this many candidates by exact scores."),
    ] = None,
    train_size: Annotated[
        int | None, typer.Option("--train-size", help="Vectors sampled to train IVF / PQ (default 64 nlist).")
    ] = None,
    max_build_seconds: Annotated[
        float | None, typer.Option("--max-build-seconds", help="Stop the build (no index) past this many seconds.")
    ] = None,
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
                kind=kind, nlist=nlist, nprobe=nprobe, hnsw_m=hnsw_m, ef_search=ef_search, pq_m=pq_m,  # type: ignore[arg-type]
                pq_nbits=pq_nbits, fast_scan=fast_scan, refine_k_factor=refine_k_factor, train_size=train_size,
                max_build_seconds=max_build_seconds, device=device,  # type: ignore[arg-type]
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
        if report.train_vectors:
            table.add_row("trained on (vectors)", f"{report.train_vectors:,}")
    Console().print(table)
    typer.echo(f"wrote {path}")
