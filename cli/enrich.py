"""`recsys enrich`: item metadata and shopper queries written by an LLM for a prepared catalogue (docs/enrich.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import handle_errors


def enrich_command(
    data_dir: Annotated[Path, typer.Option("--data-dir", help="A prepared directory (recsys data prepare).")],
    backend: Annotated[str, typer.Option("--backend", help="local (a model here) or http (OpenAI-compatible).")] = (
        "local"
    ),
    model: Annotated[
        str, typer.Option("--model", help="local: gemma3-270m, a .gguf file or a HF directory; http: its name.")
    ] = "gemma3-270m",
    url: Annotated[str | None, typer.Option("--url", help="http: the server, e.g. http://127.0.0.1:8080/v1.")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="Ask at most this many items (the rest: next run).")] = (
        None
    ),
    first: Annotated[
        Path | None, typer.Option("--first", help="A file of item ids (one per line) to enrich before the others.")
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Items per model call and cache write.")] = 8,
    device: Annotated[str, typer.Option("--device", help="local: auto, cpu or cuda.")] = "auto",
    threads: Annotated[int | None, typer.Option("--threads", help="local, on the CPU: torch threads.")] = None,
    records: Annotated[
        Path | None,
        typer.Option("--records", help="An item_metadata.parquet made elsewhere (a GPU run): its answers are reused."),
    ] = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="Ask again for items that failed.")] = False,
    cache_dir: Annotated[Path, typer.Option("--cache-dir", help="The answers' cache (resumable).")] = Path(
        ".cache/enrich"
    ),
) -> None:
    """Write item_metadata.parquet into DATA_DIR: per item with text, a category, brand, keywords, a description and
    shopper queries (or why it failed). Stop it at any time: the next run asks only for what is missing."""
    from recsys.enrich.config import EnrichConfig
    from recsys.errors import ConfigError

    with handle_errors():
        if backend not in ("local", "http"):
            raise ConfigError(f"--backend {backend!r} is not local or http. Fix: pick one of them")
        if first is not None and not first.is_file():
            raise ConfigError(f"--first {first}: no such file. Fix: give a file of item ids, one per line")
        if records is not None and not records.is_file():
            raise ConfigError(f"--records {records}: no such file. Fix: give an item_metadata.parquet")
        config = EnrichConfig(backend=backend, model=model, url=url, limit=limit, batch_size=batch_size,  # type: ignore[arg-type]
                              device=device, threads=threads,
                              records=None if records is None else str(records))  # fmt: skip
        from pipelines.enrich import enrich_step

        ids = first.read_text().split() if first is not None else []
        summary = enrich_step(config, data_dir, data_dir, cache_dir, first=ids, retry_failed=retry_failed)
    typer.echo(
        f"{summary.ok} of {summary.items} items with a record ({summary.failed} failed, {summary.left} left for the "
        f"next run); {summary.asked} asked in {summary.seconds:.0f} s -> {data_dir / 'item_metadata.parquet'}"
    )
