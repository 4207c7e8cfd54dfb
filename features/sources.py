"""The registry of raw data sources: a name (what `recsys data prepare --source` takes) -> its loader.

Example:
    >>> sorted(SOURCES)
    ['amazon-p5', 'amazon-p5-domains', 'amazon-raw', 'movielens', 'synthetic']
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import ConfigDict, ValidationError, create_model

from features.loaders import load_amazon_p5, load_amazon_p5_domains, load_amazon_raw, load_movielens, open_amazon_p5
from features.raw import RawDataset, RawStream
from recsys.errors import ConfigError
from recsys.runtime.validation import as_json, problems

if TYPE_CHECKING:
    from features.synthetic import SyntheticConfig

Loaded = TypeVar("Loaded")


# bytes of raw input a synthetic user stands for (~17 interactions): sizes the stream's chunks and the prepared parts
SYNTHETIC_BYTES_PER_USER = 600


def load_synthetic(
    *,
    num_users: int | None = None,
    num_items: int | None = None,
    seed: int = 0,
    session_reset_prob: float | None = None,
    domains: Sequence[str] | None = None,
    domain_concentration: float | None = None,
) -> RawDataset:
    """Generate the synthetic data set (`features.synthetic`), deterministic by seed.

    Args:
        num_users: number of users; None keeps the generator's default.
        num_items: number of items; None keeps the generator's default.
        seed: random seed.
        session_reset_prob: P(a new session switches the user's focus and breaks the follow-up chain), which makes
            time gaps informative; None keeps the generator's default (0: time does not shape the items).
        domains: the domains the catalogue's items are split over (e.g. ["beauty", "sports"]); None keeps the
            generator's three.
        domain_concentration: Dirichlet concentration of each user's traffic over the domains (small: mostly one
            domain; large: every domain alike); None keeps the generator's default (0.3).
    """
    from features.synthetic import generate_synthetic  # lazy: the generator is optional here

    return generate_synthetic(
        _synthetic_config(seed, num_users, num_items, session_reset_prob, domains, domain_concentration)
    )


def open_synthetic(
    *,
    num_users: int | None = None,
    num_items: int | None = None,
    seed: int = 0,
    session_reset_prob: float | None = None,
    domains: Sequence[str] | None = None,
    domain_concentration: float | None = None,
) -> RawStream:
    """The synthetic data set as a stream of user chunks (`features.synthetic.iter_synthetic`): the same rows as
    `load_synthetic`, in memory that does not grow with the number of users."""
    from features.synthetic import iter_synthetic, synthetic_items

    config = _synthetic_config(seed, num_users, num_items, session_reset_prob, domains, domain_concentration)
    return RawStream(
        batches=lambda batch_bytes: iter_synthetic(config, max(1, batch_bytes // SYNTHETIC_BYTES_PER_USER)),
        items=synthetic_items(config),
        source="synthetic",
        size_bytes=config.num_users * SYNTHETIC_BYTES_PER_USER,
    )


def _synthetic_config(
    seed: int,
    num_users: int | None,
    num_items: int | None,
    session_reset_prob: float | None,
    domains: Sequence[str] | None,
    domain_concentration: float | None,
) -> SyntheticConfig:
    """The generator's config: its defaults, but for the options given (not None)."""
    from features.synthetic import SyntheticConfig

    given: dict[str, Any] = {
        "num_users": num_users,
        "num_items": num_items,
        "session_reset_prob": session_reset_prob,
        "domains": None if domains is None else tuple(domains),
        "domain_concentration": domain_concentration,
    }
    return replace(SyntheticConfig(seed=seed), **{key: value for key, value in given.items() if value is not None})


@dataclass(frozen=True)
class Source:
    """A registered source.

    Args:
        load: the loader; file sources take the input path first, then keyword options.
        needs_input: whether the source reads files (`--input`).
        description: one line for help texts.
        stream: the loader that reads the interactions batch by batch (same arguments as `load`), for inputs of any
            size; None: the source is read in one frame.
    """

    load: Callable[..., RawDataset]
    needs_input: bool
    description: str
    stream: Callable[..., RawStream] | None = None

    def options(self) -> tuple[str, ...]:
        """The keyword options the loader accepts."""
        parameters = inspect.signature(self.load).parameters.values()
        return tuple(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


SOURCES: dict[str, Source] = {
    "synthetic": Source(
        load_synthetic, False, "generated catalog and users, deterministic by seed", stream=open_synthetic
    ),
    "amazon-p5": Source(
        load_amazon_p5, True, "user_sequence.txt (+ items.csv), the P5/TIGER form", stream=open_amazon_p5
    ),
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
    """Load a registered source into one frame.

    Args:
        name: a key of `SOURCES`, e.g. "amazon-p5".
        input_path: the file or directory to read; must be None for "synthetic".
        **options: loader keyword options (e.g. `domain`, `num_users`); None values are ignored.

    Raises:
        ConfigError: unknown source, missing or unexpected input path, or an option the loader lacks.
        DataError: the input is missing or malformed.
    """
    source = get_source(name)
    return _call(name, source, source.load, input_path, options)


def open_source(name: str, input_path: Path | None, **options: Any) -> RawDataset | RawStream:
    """A registered source as `features.prepare` takes it: a stream where the source can be read batch by batch (its
    interactions are read when prepared), else loaded into one frame. Arguments and errors as `load_source`.
    """
    source = get_source(name)
    loader: Callable[..., RawDataset | RawStream] = source.stream or source.load
    return _call(name, source, loader, input_path, options)


def _call(
    name: str, source: Source, loader: Callable[..., Loaded], input_path: Path | None, options: dict[str, Any]
) -> Loaded:
    """`loader(input_path, **options)` of `source` called `name`, once the path and options are checked."""
    given = {key: value for key, value in options.items() if value is not None}
    unknown = sorted(set(given) - set(source.options()))
    if unknown:
        accepted = ", ".join(source.options()) or "none"
        raise ConfigError(f"source {name!r} does not take option(s) {unknown}; it accepts: {accepted}")
    _check_types(name, loader, given)
    if not source.needs_input:
        if input_path is not None:
            raise ConfigError(f"source {name!r} generates its data and takes no input path (got {input_path})")
        return loader(**given)
    if input_path is None:
        raise ConfigError(
            f"source {name!r} needs an input path. Fix: data.path in an experiment config, --input FILE_OR_DIR on "
            "`recsys data prepare|validate`"
        )
    return loader(input_path, **given)


def _check_types(name: str, loader: Callable[..., Any], options: dict[str, Any]) -> None:
    """Each option of the type the loader declares for it, strictly (as JSON types: `true` is not a count, "5" not a
    number), so a wrong one is named here rather than failing somewhere inside the loader."""
    parameters = inspect.signature(loader, eval_str=True).parameters
    fields: Any = {key: (parameters[key].annotation, ...) for key in options}
    model = create_model(f"{name} options", __config__=ConfigDict(strict=True), **fields)
    try:
        model.model_validate_json(as_json(options))
    except ValidationError as err:
        raise ConfigError(
            f"source {name!r}: {problems(err)}. Fix: give the option a value of that type (data.options in an "
            "experiment config)"
        ) from err
