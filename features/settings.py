"""How raw data is prepared: the one shape of the prepare's settings, shared by `features.prepare`, the policies
(`features.policies`), `recsys data prepare|validate` and an experiment config's `data` section (which adds where
the data comes from).

Every field but the budgets changes what is prepared: `HOW_IT_RUNS` names those that do not (the memory and time
budgets bound and cut the work; the same input gives the same files under any of them).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt, ValidationError, field_validator

from recsys.data.splits import MIN_INTERACTIONS
from recsys.errors import ConfigError
from recsys.runtime.validation import problems

DEFAULT_MEMORY_BUDGET_GB = 4.0


class UnknownItems(StrEnum):
    """What to do with interactions whose item is absent from the catalog."""

    DROP = "drop"
    KEEP = "keep"
    ERROR = "error"


class PrepareSettings(BaseModel):
    """How to prepare: the policies, the cold-start draw and how the work is cut.

    Args:
        min_interactions: users with fewer interactions are dropped (>= 3: leave-one-out needs train + valid + test).
        unknown_items: "drop" | "keep" | "error" for items absent from the catalog.
        cold_start_fraction: fraction of items held out of training as cold items, in [0, 1).
        seed: seed of the cold-item draw.
        memory_budget_gb: the memory the work may use, in GiB (> 0): it sizes the batches the input is read in, and
            the resident memory the work adds is checked against it between batches and parts. It changes no output
            byte.
        partitions: the number of parts the interactions are written in; None: one per 16 MiB of input.
        max_seconds: the wall seconds the work may take (> 0), checked like the memory; None: no bound.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    HOW_IT_RUNS: ClassVar[frozenset[str]] = frozenset({"memory_budget_gb", "max_seconds"})

    min_interactions: int = MIN_INTERACTIONS
    unknown_items: UnknownItems = UnknownItems.DROP
    cold_start_fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    seed: int = 0
    memory_budget_gb: float = Field(default=DEFAULT_MEMORY_BUDGET_GB, gt=0)
    partitions: PositiveInt | None = None
    max_seconds: PositiveFloat | None = None

    @field_validator("min_interactions")
    @classmethod
    def _leave_one_out_needs_three(cls, value: int) -> int:
        if value < MIN_INTERACTIONS:
            raise ValueError(f"must be >= {MIN_INTERACTIONS} (leave-one-out needs train + valid + test), got {value}")
        return value

    @classmethod
    def checked(cls, **fields: Any) -> PrepareSettings:
        """The settings of `fields` (a command line's); ConfigError naming each bad one and its problem."""
        try:
            return cls(**fields)
        except ValidationError as err:
            raise ConfigError(f"{problems(err)}. Fix: correct these settings (docs/data.md)") from err
