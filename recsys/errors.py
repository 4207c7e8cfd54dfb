"""User-facing errors. The CLI turns every `RecsysError` into its message and exit code 2."""

from __future__ import annotations

from pathlib import Path


class RecsysError(Exception):
    """An error the user can fix: the message says what was wrong and how to fix it."""


class ConfigError(RecsysError):
    """A configuration file or option is invalid."""


class DataError(RecsysError):
    """Input data is missing or malformed.

    The message names the file, the line (1-based, as an editor shows it) or row when known,
    the problem, and the fix.

    Example:
        >>> str(DataError(Path("ratings.dat"), "timestamp 'abc' is not an integer", "fix the row", line=7))
        "ratings.dat, line 7: timestamp 'abc' is not an integer. Fix: fix the row"
    """

    def __init__(self, path: Path | str, problem: str, fix: str, *, line: int | None = None) -> None:
        self.path = Path(path)
        self.line = line
        self.problem = problem
        self.fix = fix
        where = f"{path}, line {line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {problem}. Fix: {fix}")
