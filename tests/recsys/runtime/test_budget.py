"""Budgets: a step past its seconds or its resident memory stops with an error that names the knob."""

from __future__ import annotations

import mmap
import resource
import time
from pathlib import Path

import pytest

from recsys.errors import BudgetExceeded, ConfigError, RecsysError
from recsys.runtime import budget as budget_module
from recsys.runtime.budget import Budget, BudgetGuard, Limit, limit, peak_resident_gib, resident_gib

BALLAST_BYTES = 256 * 2**20


def resident_ballast() -> mmap.mmap:
    """256 MiB that the process holds resident: a fresh anonymous mapping (never memory malloc already holds, which
    a long test session may have freed but kept) with a non-zero byte written to every page."""
    ballast = mmap.mmap(-1, BALLAST_BYTES)
    for offset in range(0, BALLAST_BYTES, mmap.PAGESIZE):
        ballast[offset] = 1
    return ballast


def test_resident_memory_is_now_and_at_most_the_peak() -> None:
    now = resident_gib()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # KiB on Linux
    assert 0.01 < now <= peak * 1.01  # a Python process with numpy and torch loaded holds tens of MB at least
    ballast = resident_ballast()
    assert resident_gib() > now + 0.2
    ballast.close()


def test_without_proc_resident_memory_is_the_peak(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(budget_module, "STATM", tmp_path / "no-proc" / "statm")  # as on macOS
    assert resident_gib() == pytest.approx(peak_resident_gib(), rel=0.01)  # an upper bound on now: budgets still trip


def test_a_tiny_memory_budget_trips_naming_the_knob_and_the_way_to_shrink() -> None:
    budget = Budget("evaluation", memory_gb=Limit(0.001, "--max-memory-gb", "lower eval.batch_size"))
    with pytest.raises(BudgetExceeded) as caught:
        budget.start().check("after 2 of 9 batches")
    message = str(caught.value)
    assert message.startswith("evaluation: holds ")
    assert "GiB of resident memory, over its budget of 0.001 GiB (after 2 of 9 batches)" in message
    assert message.endswith("Fix: raise --max-memory-gb, or lower eval.batch_size")
    assert isinstance(caught.value, RecsysError)  # the CLI prints it and exits 2


def test_a_budget_from_the_start_charges_the_step_only_what_it_adds() -> None:
    budget = Budget("the prepare", memory_gb=Limit(0.1, "--memory-budget-gb"), memory_from_start=True)
    assert resident_gib() > 0.1  # the process already holds more than the budget (torch, numpy)...
    guard = budget.start()
    guard.check("after 1 batch")  # ...which is not the step's: nothing happens
    ballast = resident_ballast()  # 256 MiB the step adds
    added = r"added 0\.\d\d GiB of resident memory \(the process holds \d+\.\d\d\), over its budget of 0\.1 GiB"
    with pytest.raises(BudgetExceeded, match=rf"^the prepare: {added} \(after 2 batches\)"):
        guard.check("after 2 batches")
    ballast.close()


def test_a_step_past_its_seconds_trips_and_one_within_does_not() -> None:
    budget = Budget("the prepare", seconds=Limit(5.0, "--max-seconds"), memory_gb=Limit(1000.0, "--memory-budget-gb"))
    budget.start().check("at part 1 of 2")  # just started, far below 1000 GiB: nothing happens
    late = BudgetGuard(budget, started=time.monotonic() - 6.0)  # started 6 s ago
    with pytest.raises(BudgetExceeded, match=r"the prepare: ran 6\.\d s, over its time budget of 5 s \(at part 2"):
        late.check("at part 2 of 2")
    with pytest.raises(BudgetExceeded, match=r"Fix: raise --max-seconds$"):
        late.check("at part 2 of 2")


def test_no_limit_never_trips_and_limits_must_be_positive() -> None:
    BudgetGuard(Budget("evaluation"), started=time.monotonic() - 1e6).check("anywhere")
    assert limit(None, "--max-seconds") is None
    assert limit(3.0, "--max-seconds") == Limit(3.0, "--max-seconds")
    with pytest.raises(ConfigError, match=r"--max-seconds must be > 0, got 0"):
        limit(0.0, "--max-seconds")
