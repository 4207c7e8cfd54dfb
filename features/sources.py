"""The registry of raw data sources: a name (what `recsys data prepare --source` takes) -> its loader.

Example:
    >>> sorted(SOURCES)
    ['amazon-p5', 'amazon-p5-domains', 'amazon-raw', 'movielens', 'synthetic']
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from features.loaders import load_amazon_p5, load_amazon_p5_domains, load_amazon_raw, load_movielens
from features.raw import RawDataset
from recsys.errors import ConfigError


def load_synthetic(
    *,
    num_users: int | None = None,
    num_items: int | None = None,
    seed: int = 0,
    session_reset_prob: float | None = None,
) -> RawDataset:
    """Generate the synthetic data set (`features.synthetic`), deterministic by seed.

    Args:
        num_users: number of users; None keeps the generator's default.
        num_items: number of items; None keeps the generator's default.
        seed: random seed.
        session_reset_prob: P(a new session switches the user's focus and breaks the follow-up chain), which makes
            time gaps informative; None keeps the generator's default (0: time does not shape the items).
    """
    from features.synthetic import SyntheticConfig, generate_synthetic  # lazy: the generator is optional here

    config = SyntheticConfig(seed=seed)
    if num_users is not None:
        config = replace(config, num_users=num_users)
    if num_items is not None:
        config = replace(config, num_items=num_items)
    if session_reset_prob is not None:
        config = replace(config, session_reset_prob=session_reset_prob)
    return generate_synthetic(config)


@dataclass(frozen=True)
class Source:
    """A registered source.

    Args:
        load: the loader; file sources take the input path first, then keyword options.
        needs_input: whether the source reads files (`--input`).
        description: one line for help texts.
    """

    load: Callable[..., RawDataset]
    needs_input: bool
    description: str

    def options(self) -> tuple[str, ...]:
        """The keyword options the loader accepts."""
        parameters = inspect.signature(self.load).parameters.values()
        return tuple(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


SOURCES: dict[str, Source] = {
    "synthetic": Source(load_synthetic, False, "generated catalog and users, deterministic by seed"),
    "amazon-p5": Source(load_amazon_p5, True, "user_sequence.txt (+ items.csv), the P5/TIGER form"),
    "amazon-p5-domains": Source(
        load_amazon_p5_domains, True, "several P5 folders as the domains of one dataset (ids get a domain prefix)"
    ),
    "amazon-raw": Source(load_amazon_raw, True, "reviews_*.json(.gz) (+ meta_*.json(.gz))"),
    "movielens": Source(load_movielens, True, "ratings.dat / ratings.csv (+ movies.dat / movies.csv)"),
}


def get_source(name: str) -> Source:
    """The registered source called `name`.

    Args:
        name: a key of `SOURCES`.

    Raises:
        ConfigError: unknown name (the message lists the valid ones).
    """
    if name not in SOURCES:
        raise ConfigError(f"unknown source {name!r}; valid sources: {', '.join(sorted(SOURCES))}")
    return SOURCES[name]


def load_source(name: str, input_path: Path | None, **options: Any) -> RawDataset:
    """Load a registered source.

    Args:
        name: a key of `SOURCES`, e.g. "amazon-p5".
        input_path: the file or directory to read; must be None for "synthetic".
        **options: loader keyword options (e.g. `domain`, `num_users`); None values are ignored.

    Raises:
        ConfigError: unknown source, missing or unexpected input path, or an option the loader lacks.
        DataError: the input is missing or malformed.
    """
    source = get_source(name)
    given = {key: value for key, value in options.items() if value is not None}
    unknown = sorted(set(given) - set(source.options()))
    if unknown:
        accepted = ", ".join(source.options()) or "none"
        raise ConfigError(f"source {name!r} does not take option(s) {unknown}; it accepts: {accepted}")
    if not source.needs_input:
        if input_path is not None:
            raise ConfigError(f"source {name!r} generates its data and takes no input path (got {input_path})")
        return source.load(**given)
    if input_path is None:
        raise ConfigError(f"source {name!r} needs an input path (--input FILE_OR_DIR)")
    return source.load(input_path, **given)
