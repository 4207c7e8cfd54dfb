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


class BudgetExceeded(RecsysError):
    """A step ran past its time or memory budget (`recsys.runtime.budget`): stopped by its own check between
    batches, before the kernel kills the process or the run outlives its slot.

    The message names the step, what was measured against the budget, how far the step got, and the fix: the knob
    that raises the budget, or how to make the work smaller.

    Example:
        >>> str(BudgetExceeded("evaluation", "ran 12.0 s, over its budget of 10.0 s", "raise --max-seconds"))
        'evaluation: ran 12.0 s, over its budget of 10.0 s. Fix: raise --max-seconds'
    """

    def __init__(self, step: str, problem: str, fix: str) -> None:
        self.step = step
        self.problem = problem
        self.fix = fix
        super().__init__(f"{step}: {problem}. Fix: {fix}")


class TrainingDiverged(RecsysError):
    """Training's loss became NaN or infinite and no validated epoch left finite weights: none are worth keeping."""


class MissingExtra(RecsysError):
    """A feature needs an optional part of the install (an extra) that is not installed.

    Example:
        >>> str(MissingExtra("the online API", "serve", "fastapi"))
        "the online API needs the optional package 'fastapi', which is not installed. Fix: pip install 'recsys[serve]'"
    """

    def __init__(self, feature: str, extra: str, package: str) -> None:
        self.feature, self.extra, self.package = feature, extra, package
        super().__init__(
            f"{feature} needs the optional package {package!r}, which is not installed. "
            f"Fix: pip install 'recsys[{extra}]'"
        )
