"""`recsys enrich`: item metadata and shopper queries written by an LLM for a prepared catalogue (docs/enrich.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.common import handle_errors

if TYPE_CHECKING:
    from recsys.enrich.run import EnrichSummary


def enrich_command(
    data_dir: Annotated[Path, typer.Option("--data-dir", help="A prepared directory (recsys data prepare).")],
    backend: Annotated[str, typer.Option("--backend", help="local (a model here) or http (OpenAI-compatible).")] = (
        "local"
    ),
    model: Annotated[
        str, typer.Option("--model", help="local: gemma3-270m, a .gguf file or a HF directory; http: its name.")
    ] = "gemma3-270m",
    url: Annotated[str | None, typer.Option("--url", help="http: the server, e.g. http://127.0.0.1:8080/v1.")] = None,
    timeout_s: Annotated[
        float, typer.Option("--timeout-s", help="http: seconds one request may take in all, to its answer's last byte.")
    ] = 60.0,
    limit: Annotated[
        int | None, typer.Option("--limit", min=0, help="Ask at most this many items (the rest: next run).")
    ] = (None),
    first: Annotated[
        Path | None, typer.Option("--first", help="A file of item ids (one per line) to enrich before the others.")
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Items per model call and cache write.")] = 8,
    device: Annotated[str, typer.Option("--device", help="local: auto, cpu or cuda.")] = "auto",
    threads: Annotated[int | None, typer.Option("--threads", min=1, help="local, on the CPU: torch threads.")] = None,
    records: Annotated[
        Path | None,
        typer.Option("--records", help="An item_metadata.parquet made elsewhere (a GPU run): its answers are reused."),
    ] = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="Ask again for items that failed.")] = False,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            "--cache-dir",
            help="The answers' cache (resumable) and the converted local model. Default: the user's cache directory, "
            "$RECSYS_CACHE_DIR/enrich, else $XDG_CACHE_HOME/recsys/enrich, else ~/.cache/recsys/enrich.",
        ),
    ] = None,
) -> None:
    """Write item_metadata.parquet into DATA_DIR: per item with text, a category, brand, keywords, a description and
    shopper queries (or why it failed). Stop it at any time: the next run asks only for what is missing."""
    from recsys.enrich.config import EnrichConfig
    from recsys.errors import ConfigError
    from recsys.runtime.user_cache import user_cache_dir

    with handle_errors():
        if backend not in ("local", "http"):
            raise ConfigError(f"--backend {backend!r} is not local or http. Fix: pick one of them")
        if first is not None and not first.is_file():
            raise ConfigError(f"--first {first}: no such file. Fix: give a file of item ids, one per line")
        if records is not None and not records.is_file():
            raise ConfigError(f"--records {records}: no such file. Fix: give an item_metadata.parquet")
        config = EnrichConfig(backend=backend, model=model, url=url, limit=limit, batch_size=batch_size,  # type: ignore[arg-type]
                              device=device, threads=threads, timeout_s=timeout_s,
                              records=None if records is None else str(records))  # fmt: skip
        from pipelines.enrich import enrich_step

        ids = _item_ids(first) if first is not None else []
        cache = cache_dir if cache_dir is not None else user_cache_dir("enrich")
        summary = enrich_step(config, data_dir, data_dir, cache, first=ids, retry_failed=retry_failed)
    typer.echo(
        f"{summary.ok} of {summary.items} items with a record ({summary.failed} failed, {summary.left} left for the "
        f"next run); {_speed(summary)} -> {data_dir / 'item_metadata.parquet'}"
    )


def _item_ids(path: Path) -> list[str]:
    """The item ids of a --first file: UTF-8 text, one per line."""
    from recsys.errors import DataError

    try:
        return path.read_bytes().decode("utf-8").split()
    except UnicodeDecodeError as err:
        raise DataError(path, f"not UTF-8 text (byte {err.start} is {err.object[err.start]:#04x})",
                        "give a text file of item ids, one per line") from err  # fmt: skip


def _speed(summary: EnrichSummary) -> str:
    """How many were asked and how fast, the model's load apart."""
    said = f"{summary.asked} asked in {summary.seconds:.0f} s"
    if summary.asked and summary.seconds:
        said += f" ({summary.asked / summary.seconds:.3g} items/s)"
    if summary.load_seconds >= 0.5:
        said += f", after loading the model in {summary.load_seconds:.0f} s"
    return said
