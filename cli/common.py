"""Helpers shared by the CLI commands."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from recsys.errors import RecsysError

ERROR_EXIT_CODE = 2


@contextmanager
def handle_errors() -> Iterator[None]:
    """Turn a `RecsysError` into "error: <message>" on stderr and exit code 2; other errors propagate.

    Example:
        >>> with handle_errors():
        ...     pass
    """
    try:
        yield
    except RecsysError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(ERROR_EXIT_CODE) from err
