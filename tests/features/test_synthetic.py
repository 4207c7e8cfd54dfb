"""Tests of the synthetic generator: determinism, schema, sizes, and that its sequential signal is real."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import Counter, defaultdict

import numpy as np
import polars as pl
import pytest

from features.raw import RawDataset
from features.synthetic import SyntheticConfig, generate_synthetic
from recsys.data.schema import (
    DOMAIN,
    INTERACTION_COLUMNS,
    ITEM_COLUMNS,
    ITEM_ID,
    OPTIONAL_INTERACTION_COLUMNS,
    TS,
    USER_ID,
)
from recsys.errors import ConfigError

SMALL = SyntheticConfig(num_users=200, num_items=300, seed=3)


@pytest.fixture(scope="module")
def default_ds() -> RawDataset:
    """The default dataset, generated once for the module (~0.2 s)."""
    return generate_synthetic(SyntheticConfig())


def test_same_seed_gives_identical_frames() -> None:
    a, b = generate_synthetic(SMALL), generate_synthetic(SMALL)
    assert a.interactions.equals(b.interactions)
    assert a.items is not None and b.items is not None and a.items.equals(b.items)
    assert a.source == "synthetic"


def test_different_seed_gives_different_frames() -> None:
    a = generate_synthetic(SMALL)
    b = generate_synthetic(SyntheticConfig(num_users=200, num_items=300, seed=4))
    assert not a.interactions.equals(b.interactions)
    assert a.items is not None and b.items is not None and not a.items.equals(b.items)


def test_schema_matches_canonical_columns() -> None:
    ds = generate_synthetic(SMALL)
    expected = {**INTERACTION_COLUMNS, **OPTIONAL_INTERACTION_COLUMNS}
    assert dict(ds.interactions.schema) == expected
    assert ds.items is not None
    for name, dtype in ITEM_COLUMNS.items():
        assert ds.items.schema[name] == dtype
    assert ds.items.schema["category"] == pl.String and ds.items.schema["brand"] == pl.String
    assert set(ds.interactions["event"].unique()) <= {"click", "purchase"}
    values = ds.interactions["value"]
    assert values.min() >= 1.0 and values.max() <= 5.0  # type: ignore[operator]


def test_sizes_ids_and_time_order() -> None:
    cfg = SyntheticConfig(num_users=123, num_items=250, seed=7, max_length=20)
    ds = generate_synthetic(cfg)
    assert ds.items is not None and ds.items.height == 250
    assert ds.items[ITEM_ID].n_unique() == 250
    lengths = ds.interactions.group_by(USER_ID).len()["len"]
    assert lengths.len() == 123
    assert lengths.min() >= 5 and lengths.max() <= 20  # type: ignore[operator]
    assert ds.interactions[USER_ID].str.contains(r"^u\d{5}$").all()
    assert ds.items[ITEM_ID].str.contains(r"^i\d{5}$").all()
    # ts strictly increasing per user and realistic unix seconds (2023 onwards).
    ordered = ds.interactions.with_columns(d=pl.col(TS).diff().over(USER_ID)).drop_nulls("d")
    assert (ordered["d"] > 0).all()
    assert ds.interactions[TS].min() >= cfg.start_ts  # type: ignore[operator]


def test_interactions_reference_catalog_and_domains(default_ds: RawDataset) -> None:
    items = default_ds.items
    assert items is not None
    joined = default_ds.interactions.join(items.select(ITEM_ID, item_domain=DOMAIN), on=ITEM_ID, how="left")
    assert joined["item_domain"].null_count() == 0
    assert (joined[DOMAIN] == joined["item_domain"]).all()
    assert set(items[DOMAIN].unique()) == {"beauty", "sports", "home"}
    assert set(default_ds.interactions[DOMAIN].unique()) == {"beauty", "sports", "home"}
    assert items["category"].n_unique() >= 30


def test_titles_look_like_words(default_ds: RawDataset) -> None:
    assert default_ds.items is not None
    titles = default_ds.items["title"].to_list()
    word = re.compile(r"^[A-Z][a-z]+$|^&$")
    for title in titles:
        words = title.split(" ")
        assert len(words) >= 4, title
        assert all(word.match(w) for w in words), title
    assert len(set(titles)) / len(titles) > 0.95  # mostly unique


def test_default_size_targets(default_ds: RawDataset) -> None:
    n = default_ds.interactions.height
    assert default_ds.interactions[USER_ID].n_unique() == 3_000
    assert 40_000 <= n <= 60_000


def test_labels_depend_on_affinity(default_ds: RawDataset) -> None:
    """Purchases are rated higher than clicks: both labels come from the same latent affinity."""
    by_event = default_ds.interactions.group_by("event").agg(pl.col("value").mean()).sort("event")
    click, purchase = by_event["value"].to_list()
    assert purchase > click + 0.4


def test_invalid_config_names_the_field() -> None:
    with pytest.raises(ConfigError, match="follow_prob"):
        SyntheticConfig(follow_prob=1.5)
    with pytest.raises(ConfigError, match="domains"):
        SyntheticConfig(domains=("beauty", "cars"))
    with pytest.raises(ConfigError, match="num_items"):
        SyntheticConfig(num_items=10)


def _leave_one_out_hit_rates(interactions: pl.DataFrame, k: int = 10) -> tuple[float, float]:
    """HR@k of (first-order successor oracle, popularity) with the last item per user as the test target."""
    seqs = interactions.sort(USER_ID, TS).group_by(USER_ID, maintain_order=True).agg(pl.col(ITEM_ID))
    histories: list[list[str]] = seqs[ITEM_ID].to_list()
    popularity: Counter[str] = Counter()
    successors: dict[str, Counter[str]] = defaultdict(Counter)
    for seq in histories:
        train = seq[:-1]
        popularity.update(train)
        for prev, nxt in itertools.pairwise(train):
            successors[prev][nxt] += 1
    top_pop = [item for item, _ in popularity.most_common(k)]
    pop_hits, seq_hits = [], []
    for seq in histories:
        target, prev = seq[-1], seq[-2]
        ranked = [item for item, _ in successors[prev].most_common(k)]
        ranked += [item for item in top_pop if item not in ranked][: k - len(ranked)]
        seq_hits.append(target in ranked)
        pop_hits.append(target in top_pop)
    return float(np.mean(seq_hits)), float(np.mean(pop_hits))


def test_sequential_signal_beats_popularity(default_ds: RawDataset) -> None:
    """Measured at the defaults, seeds 0-5: successor HR@10 0.54-0.56, popularity 0.069-0.084 (6.5-8x)."""
    seq_hr, pop_hr = _leave_one_out_hit_rates(default_ds.interactions)
    assert pop_hr > 0.02, pop_hr  # popularity is a real baseline, so the ratio below is not vacuous
    assert seq_hr >= 3.0 * pop_hr, (seq_hr, pop_hr)


def test_follow_up_links_carry_the_signal(default_ds: RawDataset) -> None:
    """Control: without follow-up links only the focus-category continuity is left to the oracle.

    Measured at the defaults, seeds 0-3: successor HR@10 0.36-0.38 with follow_prob=0 vs 0.54-0.56.
    """
    with_links, _ = _leave_one_out_hit_rates(default_ds.interactions)
    no_links = generate_synthetic(dataclasses.replace(SyntheticConfig(), follow_prob=0.0))
    without, _ = _leave_one_out_hit_rates(no_links.interactions)
    assert with_links > without + 0.1, (with_links, without)


def _same_category_share(ds: RawDataset, long_gap: bool) -> float:
    """Share of consecutive events of a user in the same category, after a gap of > 1 h (long) or < 1 h."""
    category = dict(zip(ds.items[ITEM_ID].to_list(), ds.items["category"].to_list(), strict=True))
    frame = ds.interactions.with_columns(
        pl.col(ITEM_ID).replace_strict(category).alias("category"),
        pl.col(TS).diff().over(USER_ID).alias("gap"),
    ).with_columns(pl.col("category").shift().over(USER_ID).alias("previous"))
    pairs = frame.filter(pl.col("gap") > 3_600 if long_gap else pl.col("gap") < 3_600)
    return float((pairs["category"] == pairs["previous"]).mean())  # type: ignore[arg-type]


def test_session_resets_make_time_gaps_informative() -> None:
    """Without resets the items ignore time (same category after a long gap as after a short one); with them a
    user back after hours or days more often continues elsewhere. Measured at seed 3: 0.20 vs 0.22 without,
    0.17 vs 0.26 with resets (the same-category share understates it: most follow-ups go to the paired category)."""
    plain = generate_synthetic(SMALL)
    reset = generate_synthetic(dataclasses.replace(SMALL, session_reset_prob=1.0))
    assert abs(_same_category_share(plain, True) - _same_category_share(plain, False)) < 0.05
    assert _same_category_share(reset, True) < _same_category_share(reset, False) - 0.06
    assert reset.interactions.height == plain.interactions.height  # the same users and lengths, other items
