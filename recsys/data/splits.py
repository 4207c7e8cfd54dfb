"""The leave-one-out split of the evaluation protocol (docs/training.md), by position in each user's chronological
sequence: the last interaction is the test target, the second-to-last the validation target, the rest trains. It is
the one owner of that rule: the prepared data stores no split column, and the data layer's counts come from here.

Example:
    >>> held_out(VALID), split_counts(num_interactions=10, num_users=2)
    (2, {'train': 6, 'valid': 2, 'test': 2})
"""

from __future__ import annotations

TRAIN, VALID, TEST = "train", "valid", "test"
RULE = "leave-one-out per user, by ts (ties in file order): last = test, second-to-last = valid, rest = train"
MIN_INTERACTIONS = 3  # a user needs a training item, a validation target and a test target
_HELD_OUT = {VALID: 2, TEST: 1}


def held_out(split: str) -> int:
    """How many interactions at the end of each sequence the model may not read when predicting `split`'s target
    (the target is the first of them)."""
    if split not in _HELD_OUT:
        raise ValueError(f"split must be {VALID!r} or {TEST!r}, got {split!r}")
    return _HELD_OUT[split]


def split_counts(num_interactions: int, num_users: int) -> dict[str, int]:
    """Interactions per split, in the order train, valid, test."""
    return {TRAIN: num_interactions - 2 * num_users, VALID: num_users, TEST: num_users}
