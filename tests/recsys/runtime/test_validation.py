"""config_from: unknown keys, bounds on fields, checks across fields and the fields the program fills in, each named
by its dotted key."""

from __future__ import annotations

import pytest

from recsys.errors import ConfigError
from recsys.models.sasrec import SASRecConfig
from recsys.runtime.validation import config_from
from recsys.training.config import TrainConfig


def test_a_bound_on_a_field_names_its_key() -> None:
    with pytest.raises(ConfigError) as info:
        config_from(TrainConfig, {"schedule": {"epochs": -1}, "optimization": {"lr": 0.0}}, "train.")
    assert str(info.value) == (
        "train.schedule.epochs: Input should be greater than 0; train.optimization.lr: Input should be greater than 0"
    )


def test_a_check_across_fields_names_its_key() -> None:
    with pytest.raises(ConfigError) as info:
        config_from(SASRecConfig, {"num_items": 5, "dim": 64, "num_heads": 3}, "model.params.")
    assert str(info.value).startswith("model.params.num_heads: 3 does not divide dim (64) into equal attention heads")


def test_filled_fields_stand_in_and_are_not_the_users_to_set() -> None:
    config = config_from(SASRecConfig, {"dim": 32}, "model.params.", filled={"num_items": 1})
    assert (config.num_items, config.dim) == (1, 32)
    with pytest.raises(ConfigError) as info:
        config_from(SASRecConfig, {"num_items": 7}, "model.params.", filled={"num_items": 1})
    assert str(info.value).startswith("model.params.num_items: unknown key (known: max_history, dim,")
    assert "num_items," not in str(info.value)


def test_problems_names_each_key_and_a_model_wide_check_without_an_empty_key() -> None:
    from pydantic import BaseModel, ValidationError, model_validator

    from recsys.runtime.validation import problems

    class Window(BaseModel):
        start: int
        end: int

        @model_validator(mode="after")
        def _ordered(self) -> Window:
            if self.end < self.start:
                raise ValueError("end comes before start. Fix: swap them")
            return self

    with pytest.raises(ValidationError) as wrong_type:
        Window(start="x", end=1)  # type: ignore[arg-type]
    said = "window.start: Input should be a valid integer, unable to parse string as an integer"
    assert problems(wrong_type.value, "window.") == said
    with pytest.raises(ValidationError) as unordered:
        Window(start=2, end=1)
    assert problems(unordered.value, "window.") == "window: end comes before start. Fix: swap them"
    assert problems(unordered.value) == "end comes before start. Fix: swap them"
