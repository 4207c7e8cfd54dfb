"""Synthetic generator: the platform's embedded default dataset (docs/data.md).

The generator needs no files and gives the same frames for the same config. It produces:

- a catalog of items spread over several domains (beauty, sports, home, ...), each with its own categories.
  Titles are built from brand + two attributes + category noun, e.g. "Lumina Matte Rose Lipstick".
  Popularity within a category follows a Zipf law.
- users whose category tastes drift: a slow drift from a start taste to an end taste over the
  sequence, and a current *focus* category that switches with some probability at each step;
- sequential regularities: every item has a few "follow-up" items, mostly of the paired (complementary)
  category, same brand preferred: Shampoo -> Conditioner, Tennis Racket -> Tennis Balls. With
  probability `follow_prob` the next item follows one of the previous item's links; otherwise it is
  drawn from the user's current taste;
- time: sessions of events minutes apart, days between sessions. By default time does not shape the items;
  with `session_reset_prob` > 0 a new session breaks the follow-up chain and switches the focus with that
  probability (a user back after days wants something else), so time-aware models have a signal to find;
- multi-task labels: `event` ("click" / "purchase") and `value` (rating 1..5). Both depend on a latent
  user-item affinity (a dot product of random factors plus an item-quality bias), so they can be learned.

Scale: the catalog comes first from the seed's stream (`synthetic_items` builds it alone), then the follow-up links
(O(N K log N)) and the item factors; users come in blocks of `USERS_PER_BLOCK`, each drawn from its own stream
(seed, block), so `iter_synthetic` streams any number of users in bounded memory (10^7 users, 10^6 items, 10^8
interactions: see `iter_synthetic`) and its rows do not depend on the chunk size. Datasets of at most
`SINGLE_STREAM_MAX_USERS` users and `SINGLE_STREAM_MAX_ITEMS` items (the default among them) are instead drawn from
the single stream every earlier version drew, all users at once with exact Gumbel top-K follow-ups (quadratic in
items, cheap at these sizes), so that they stay byte-identical to those versions; the two paths draw from the
same laws.

Letters used in shape comments: U users, B users of a block, N items, C categories, K follow-ups per item, T max
length, F latent dimension, G (category, brand) groups.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import polars as pl

from features.raw import RawDataset
from recsys.data.schema import DOMAIN, EVENT, ITEM_ID, TITLE, TS, USER_ID, VALUE
from recsys.errors import ConfigError
from recsys.runtime.progress import Progress

logger = logging.getLogger(__name__)

CLICK, PURCHASE = "click", "purchase"
INTERACTION_SCHEMA = {USER_ID: pl.String, ITEM_ID: pl.String, TS: pl.Int64, DOMAIN: pl.String, EVENT: pl.String,
                      VALUE: pl.Float32}  # fmt: skip

# Sizes up to which a dataset is drawn from the single historical stream (module docstring).
SINGLE_STREAM_MAX_USERS = 10_000
SINGLE_STREAM_MAX_ITEMS = 5_000
# Users per block of the block path: the unit of randomness (block b draws from the stream (seed, 2, b)), so part
# of what a seed means; changing it changes every large dataset. 16,384 users (~280k interactions) amortise the
# per-step numpy overhead while keeping a block's arrays at tens of MB.
USERS_PER_BLOCK = 16_384
_SESSION_STREAM, _USER_STREAM = 1, 2  # second entry of the seed sequences of the session flags and user blocks
_LENGTH_GROUPS = 8  # groups of similar length a block is walked in (`_walk_by_length`); part of the randomness too
_MAX_LINK_DRAWS = 32  # tries per follow-up link of `_sampled_followups` before repeating the strongest link


@dataclass(frozen=True)
class _DomainVocab:
    """The words of one domain. Categories come in complementary pairs: (0, 1), (2, 3), ..."""

    categories: tuple[str, ...]
    brands: tuple[str, ...]
    styles: tuple[str, ...]  # first attribute: finish / material / line
    variants: tuple[str, ...]  # second attribute: colour / scent / flavour


VOCABULARY: dict[str, _DomainVocab] = {
    "beauty": _DomainVocab(
        categories=(
            "Shampoo", "Conditioner", "Face Cleanser", "Moisturizer", "Lipstick", "Lip Liner",
            "Mascara", "Eyeliner", "Nail Polish", "Nail Polish Remover", "Perfume", "Body Lotion",
        ),
        brands=("Lumina", "Velora", "Aurelle", "Mirabel", "Solenne", "Kaiya", "Opaline", "Rosewell"),
        styles=("Matte", "Hydrating", "Velvet", "Radiant", "Gentle", "Silk", "Ultra", "Nourishing", "Sheer"),
        variants=("Rose", "Coral", "Vanilla", "Lavender", "Coconut", "Berry", "Peony", "Citrus", "Jasmine"),
    ),
    "sports": _DomainVocab(
        categories=(
            "Running Shoes", "Running Socks", "Tennis Racket", "Tennis Balls", "Yoga Mat", "Yoga Block",
            "Water Bottle", "Gym Bag", "Resistance Bands", "Foam Roller", "Cycling Helmet", "Bike Light",
        ),
        brands=("Vantor", "Kinetiq", "Peakline", "Aerix", "Trailmark", "Zentro", "Fleetfoot", "Corvane"),
        styles=("Pro", "Lightweight", "Trail", "Classic", "Elite", "Compact", "Performance", "Flex", "Aero"),
        variants=("Black", "Blue", "Neon", "Graphite", "Red", "Olive", "White", "Orange", "Teal"),
    ),
    "home": _DomainVocab(
        categories=(
            "Coffee Maker", "Coffee Mug", "Cookware Set", "Kitchen Knife", "Bed Sheets", "Pillow",
            "Throw Blanket", "Scented Candle", "Desk Lamp", "Light Bulb", "Storage Basket", "Wall Shelf",
        ),
        brands=("Hearthly", "Nordvik", "Casamia", "Oakhaven", "Linnea", "Domora", "Ember & Co", "Willowby"),
        styles=("Modern", "Rustic", "Nordic", "Cozy", "Minimal", "Deluxe", "Vintage", "Soft", "Compact"),
        variants=("Oak", "Linen", "Ceramic", "Slate", "Ivory", "Walnut", "Sage", "Charcoal", "Copper"),
    ),
    "electronics": _DomainVocab(
        categories=(
            "Smartphone", "Phone Case", "Laptop", "Laptop Sleeve", "Headphones", "Headphone Stand",
            "Smartwatch", "Watch Band", "Camera", "Memory Card", "Bluetooth Speaker", "Charging Cable",
        ),
        brands=("Voltra", "Nexon", "Quantix", "Orbis", "Pixelon", "Arcwave", "Sonique", "Heliox"),
        styles=("Wireless", "Pro", "Mini", "Max", "Smart", "Slim", "Rugged", "Fast", "Portable"),
        variants=("Black", "Silver", "Midnight", "Graphite", "White", "Blue", "Rose Gold", "Green", "Teal"),
    ),
    "grocery": _DomainVocab(
        categories=(
            "Coffee Beans", "Coffee Filters", "Pasta", "Pasta Sauce", "Tortilla Chips", "Salsa",
            "Green Tea", "Honey", "Granola", "Almond Milk", "Dark Chocolate", "Sparkling Water",
        ),
        brands=("Harvest Lane", "Verdi", "Goldfield", "Mesa", "Bramble", "Olivetta", "Sunmill", "Tierra"),
        styles=("Organic", "Roasted", "Classic", "Artisan", "Golden", "Mild", "Crunchy", "Premium", "Light"),
        variants=("Tomato", "Basil", "Vanilla", "Hazelnut", "Lemon", "Garlic", "Cinnamon", "Chili", "Maple"),
    ),
}  # fmt: skip

_DAY = 86_400


@dataclass(frozen=True)
class SyntheticConfig:
    """Sizes and knobs of the synthetic dataset; the defaults make the platform's demo dataset.

    The default size (~3,000 users, 1,500 items, ~50k interactions) lets a 2-layer SASRec with d=64 and a
    full softmax train in about a minute on two CPU cores.
    """

    seed: int = 0
    num_users: int = 3_000
    num_items: int = 1_500  # split evenly over the domains, then over each domain's 12 categories
    domains: tuple[str, ...] = ("beauty", "sports", "home")  # any of VOCABULARY's keys
    # Sequence length ~ round(LogNormal(log(median), sigma)), clipped to [min_length, max_length]:
    # the defaults give a mean of ~17 and a long tail up to the cap.
    min_length: int = 5
    max_length: int = 50
    length_median: float = 14.0
    length_sigma: float = 0.6
    # Sequential signal: P(next item is one of the previous item's follow-ups). At 0 only the focus-category
    # continuity is left (successor-oracle HR@10 ~0.37 instead of ~0.55 at the defaults).
    follow_prob: float = 0.5
    num_followups: int = 3  # K links per item, used with weights 1, decay, decay^2, ...
    followup_decay: float = 0.5
    followup_same_brand: float = 4.0  # weight multiplier of a same-brand follow-up candidate
    followup_other_category: float = 0.15  # weight of a non-paired category of the same domain (paired = 1)
    # Tastes: P(focus category switches at a step); Dirichlet mass of a taste over categories (smaller =
    # fewer favourite categories); share of the end taste that is new (0 = no slow drift).
    focus_switch_prob: float = 0.3
    taste_concentration: float = 4.0
    domain_concentration: float = 0.3  # Dirichlet over domains per user: small = mostly one domain
    taste_drift: float = 0.5
    item_zipf: float = 0.8  # Zipf exponent of item popularity within its category
    # Labels: affinity = user_factors . item_factors / sqrt(F) + quality, roughly N(0, 1.1^2).
    latent_dim: int = 8
    affinity_choice: float = 1.0  # best-of-2 choice by affinity among popularity-drawn candidates; 0 = off
    purchase_base_logit: float = -1.5  # gives ~30% purchases; P(purchase) = sigmoid(base + 1.5 * affinity)
    rating_noise: float = 0.5  # std of the Gaussian noise before rounding a rating
    start_ts: int = 1_672_531_200  # 2023-01-01T00:00:00Z; users start uniformly in [start, start + span)
    span_days: int = 365
    in_session_prob: float = 0.7  # P(an event follows the previous one within minutes, in the same session)
    # P(the focus switches at the first event of a new session, which never follows a link); 0 = time does not
    # shape the items (the default; the items are then identical to those of earlier versions)
    session_reset_prob: float = 0.0

    def __post_init__(self) -> None:
        unknown = [d for d in self.domains if d not in VOCABULARY]
        if not self.domains or unknown:
            raise ConfigError(f"SyntheticConfig.domains={self.domains!r}: choose from {sorted(VOCABULARY)}")
        if len(set(self.domains)) != len(self.domains):
            raise ConfigError(f"SyntheticConfig.domains={self.domains!r} has duplicates")
        num_categories = sum(len(VOCABULARY[d].categories) for d in self.domains)
        checks = {
            "num_users": self.num_users >= 1,
            "num_items": self.num_items >= num_categories,
            "min_length": 1 <= self.min_length <= self.max_length,
            "length_median": self.length_median > 0,
            "length_sigma": self.length_sigma >= 0,
            "follow_prob": 0.0 <= self.follow_prob <= 1.0,
            "num_followups": self.num_followups >= 1,
            "followup_decay": self.followup_decay > 0,
            "focus_switch_prob": 0.0 <= self.focus_switch_prob <= 1.0,
            "taste_concentration": self.taste_concentration > 0,
            "domain_concentration": self.domain_concentration > 0,
            "taste_drift": 0.0 <= self.taste_drift <= 1.0,
            "latent_dim": self.latent_dim >= 1,
            "span_days": self.span_days >= 1,
            "in_session_prob": 0.0 <= self.in_session_prob <= 1.0,
            "session_reset_prob": 0.0 <= self.session_reset_prob <= 1.0,
        }
        for name, ok in checks.items():
            if not ok:
                hint = f" (at least the {num_categories} categories)" if name == "num_items" else ""
                raise ConfigError(f"SyntheticConfig.{name}={getattr(self, name)!r} is out of range{hint}")


@dataclass(frozen=True)
class _Catalog:
    """Items as arrays (index = internal item number) plus the per-category sampling table."""

    domain: np.ndarray  # (N,) int, index into config.domains
    category: np.ndarray  # (N,) int, global category index; items are sorted by it
    brand: np.ndarray  # (N,) int, index into the domain's brands
    popularity: np.ndarray  # (N,) float, Zipf weight normalised to sum 1 within each category
    search_items: _KeySearch  # over category + within-category CDF keys: search_items(cat + u) draws from cat
    item_ids: pl.Series  # (N,) str, "i00042"
    titles: list[str]
    category_names: list[str]  # (C,)
    category_domain: np.ndarray  # (C,) int
    category_share: np.ndarray  # (C,) float, share of its domain's traffic, sums to 1 per domain


@dataclass(frozen=True)
class _ItemModel:
    """What the users' walk needs of the items beside the catalog."""

    followups: np.ndarray  # (N, K) int, link 0 strongest
    factors: np.ndarray  # (N, F) latent item factors
    quality: np.ndarray  # (N,) item bias of the affinity


@dataclass(frozen=True)
class _Users:
    """One group of users' lengths, tastes (as row-wise CDFs over categories) and latent factors."""

    lengths: np.ndarray  # (B,) int
    cdf_start: np.ndarray  # (B, C) taste at the start of the sequence
    cdf_end: np.ndarray  # (B, C) taste it drifts to
    factors: np.ndarray  # (B, F)

    def take(self, rows: np.ndarray) -> _Users:
        return _Users(self.lengths[rows], self.cdf_start[rows], self.cdf_end[rows], self.factors[rows])


def _zipf_weights(rng: np.random.Generator, n: int, exponent: float) -> np.ndarray:
    """Weights 1 / rank^exponent over a random permutation of ranks, normalised to sum 1."""
    ranks = rng.permutation(n) + 1
    w = 1.0 / ranks.astype(np.float64) ** exponent
    return w / w.sum()


def _group_cdf_keys(group: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """group + the within-group CDF of `weight` (which sums to 1 per group), for `group` sorted ascending:
    searchsorted(keys, g + u, side="right") then draws a member of group g by weight. The last key of each group
    is exactly g + 1, so that no rounding lets a draw spill into the next group."""
    keys = np.empty_like(weight)
    starts = np.r_[0, np.flatnonzero(np.diff(group)) + 1, len(group)]
    for lo, hi in itertools.pairwise(starts):
        local = np.cumsum(weight[lo:hi])
        local[-1] = 1.0
        keys[lo:hi] = group[lo] + local
    return keys


@dataclass(frozen=True)
class _KeySearch:
    """`np.searchsorted(keys, x, side="right")` over sorted keys in [0, G] (`_group_cdf_keys`), through a guide table.

    The table holds, for `per_unit` evenly spaced points per unit of key, how many keys lie at or below each; the
    answer for x lies between the entries of the points around it, so a few vectorised bisection steps over that
    window give exactly searchsorted's answer. The full search misses the cache at every level once the keys
    outgrow it: at 10^6 items the walk's draws took 2x as long per draw as at 10^5, and were its largest cost.
    """

    keys: np.ndarray  # (N,) sorted
    per_unit: int
    guide: np.ndarray  # (G * per_unit + 1,) int64: how many keys are <= j / per_unit
    steps: int  # bisection steps that close the widest window

    @classmethod
    def build(cls, keys: np.ndarray, num_groups: int) -> _KeySearch:
        per_unit = max(1, len(keys) // max(num_groups, 1))  # about one key per point
        guide = np.searchsorted(keys, np.arange(num_groups * per_unit + 1) / per_unit, side="right")
        widest = int((guide[3:] - guide[:-3]).max()) if len(guide) > 3 else len(keys)  # a window spans 3 points
        return cls(keys, per_unit, guide, steps=int(np.ceil(np.log2(widest + 1))))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        point = np.floor(x * self.per_unit).astype(np.int64)
        last = len(self.guide) - 1
        # from one point below x to two above: the answer lies in between whatever the rounding of x * per_unit
        lo = self.guide[np.clip(point - 1, 0, last)]
        hi = self.guide[np.clip(point + 2, 0, last)]
        for _ in range(self.steps):
            mid = (lo + hi) >> 1
            below = (mid < hi) & (self.keys[np.minimum(mid, len(self.keys) - 1)] <= x)
            lo = np.where(below, mid + 1, lo)
            hi = np.where(below, hi, mid)
        return lo


def _build_catalog(config: SyntheticConfig, rng: np.random.Generator) -> _Catalog:
    """Split items over domains and categories, draw brands and popularity, and make titles."""
    num_domains = len(config.domains)
    per_domain = np.full(num_domains, config.num_items // num_domains)
    per_domain[: config.num_items % num_domains] += 1

    domain, category, brand, popularity = [], [], [], []
    category_names: list[str] = []
    category_domain: list[int] = []
    category_share: list[np.ndarray] = []
    for d, name in enumerate(config.domains):
        vocab = VOCABULARY[name]
        n_cat = len(vocab.categories)
        share = _zipf_weights(rng, n_cat, 0.7)  # some categories are busier than others
        # Category sizes: one item each, the rest proportional to a Dirichlet draw (varied sizes).
        sizes = 1 + rng.multinomial(per_domain[d] - n_cat, rng.dirichlet(np.full(n_cat, 5.0)))
        for c, size in enumerate(sizes):
            cat_id = len(category_names) + c
            domain.append(np.full(size, d))
            category.append(np.full(size, cat_id))
            brand.append(rng.choice(len(vocab.brands), size=size, p=_zipf_weights(rng, len(vocab.brands), 0.8)))
            popularity.append(_zipf_weights(rng, size, config.item_zipf))
        category_names.extend(vocab.categories)
        category_domain.extend([d] * n_cat)
        category_share.append(share)

    cat, pop = np.concatenate(category), np.concatenate(popularity)
    dom, brd = np.concatenate(domain), np.concatenate(brand)
    width = max(5, len(str(config.num_items - 1)))
    return _Catalog(
        domain=dom,
        category=cat,
        brand=brd,
        popularity=pop,
        search_items=_KeySearch.build(_group_cdf_keys(cat, pop), len(category_names)),
        item_ids=pl.Series(ITEM_ID, [f"i{i:0{width}d}" for i in range(config.num_items)], dtype=pl.String),
        titles=_make_titles(config, dom, brd, [category_names[c] for c in cat], rng),
        category_names=category_names,
        category_domain=np.asarray(category_domain),
        category_share=np.concatenate(category_share),
    )


def _make_titles(
    config: SyntheticConfig, domain: np.ndarray, brand: np.ndarray, nouns: list[str], rng: np.random.Generator
) -> list[str]:
    """'Brand Style Variant Noun' per item; up to three redraws avoid most duplicate titles."""
    vocabs = [VOCABULARY[d] for d in config.domains]
    n = len(nouns)
    # Up to 4 tries of (style, variant) per item, as word indices (computed at once: the loop is per item).
    num_styles = np.array([len(v.styles) for v in vocabs])[domain][:, None]
    num_variants = np.array([len(v.variants) for v in vocabs])[domain][:, None]
    styles = (rng.random((n, 4)) * num_styles).astype(np.int64).tolist()
    variants = (rng.random((n, 4)) * num_variants).astype(np.int64).tolist()
    titles: list[str] = []
    used: set[str] = set()
    for i, (d, b, noun) in enumerate(zip(domain.tolist(), brand.tolist(), nouns, strict=True)):
        vocab = vocabs[d]
        for style, variant in zip(styles[i], variants[i], strict=True):
            title = f"{vocab.brands[b]} {vocab.styles[style]} {vocab.variants[variant]} {noun}"
            if title not in used:
                break
        used.add(title)
        titles.append(title)
    return titles


def _items_frame(config: SyntheticConfig, catalog: _Catalog) -> pl.DataFrame:
    """The catalog in the canonical item schema: item_id, title, domain, category, brand."""
    brands = [VOCABULARY[config.domains[d]].brands[b] for d, b in zip(catalog.domain, catalog.brand, strict=True)]
    return pl.DataFrame(
        {
            ITEM_ID: catalog.item_ids,
            TITLE: catalog.titles,
            DOMAIN: np.array(config.domains)[catalog.domain],
            "category": np.array(catalog.category_names)[catalog.category],
            "brand": brands,
        },
        schema={ITEM_ID: pl.String, TITLE: pl.String, DOMAIN: pl.String, "category": pl.String, "brand": pl.String},
    )


def _link_weight(
    config: SyntheticConfig,
    catalog: _Catalog,
    source: tuple[np.ndarray, np.ndarray],
    target: tuple[np.ndarray, np.ndarray],
) -> np.ndarray:
    """(R, M) follow-up weight factor from each of R (category, brand) pairs to each of M, before popularity.

    Category factor: paired category 1, same category 0, another category of the same domain
    `followup_other_category`, another domain 0; times `followup_same_brand` for the same brand.
    """
    first_of_domain = np.searchsorted(catalog.category_domain, catalog.category_domain)  # (C,)
    local_cat = np.arange(len(first_of_domain)) - first_of_domain  # index within its domain; pairs (0, 1), (2, 3)
    src_cat, dst_cat = source[0][:, None], target[0][None, :]
    same_domain = catalog.category_domain[src_cat] == catalog.category_domain[dst_cat]
    paired = same_domain & ((local_cat[src_cat] ^ 1) == local_cat[dst_cat])
    other = np.where(src_cat == dst_cat, 0.0, config.followup_other_category)
    cat_factor = np.where(paired, 1.0, np.where(same_domain, other, 0.0))
    same_brand = source[1][:, None] == target[1][None, :]  # brand indices are per domain: only compared within one
    return cat_factor * np.where(same_brand, config.followup_same_brand, 1.0)


def _exact_followups(config: SyntheticConfig, catalog: _Catalog, rng: np.random.Generator) -> np.ndarray:
    """(N, K) follow-up items per item, drawn without replacement (Gumbel top-K) over every item of the domain.

    Candidate weight = popularity * `_link_weight`, the item itself excluded. The K links are ordered, so link 0
    is the strongest. It draws N x (items of the domain) Gumbels: quadratic, kept for the single-stream path only
    (small datasets stay byte-identical to earlier versions); `_sampled_followups` draws from the same law.
    """
    n, k = len(catalog.category), config.num_followups
    followups = np.empty((n, k), dtype=np.int64)  # (N, K)
    log_pop = np.log(catalog.popularity)
    for d in range(len(config.domains)):
        members = np.flatnonzero(catalog.domain == d)  # (M,)
        kk = min(k, len(members) - 1)
        target = (catalog.category[members], catalog.brand[members])
        for lo in range(0, len(members), 512):  # row chunks keep memory at 512 x M
            rows = members[lo : lo + 512]  # (R,)
            weight = _link_weight(config, catalog, (catalog.category[rows], catalog.brand[rows]), target)
            weight[rows[:, None] == members[None, :]] = 0.0  # never link to itself
            with np.errstate(divide="ignore"):
                key = np.log(weight) + log_pop[members][None, :] + rng.gumbel(size=weight.shape)
            top = np.argsort(-key, axis=1, kind="stable")[:, :kk]  # (R, kk), strongest first
            followups[rows, :kk] = members[top]
            followups[rows, kk:] = members[top[:, :1]]  # tiny domains: repeat the strongest link
    return followups


def _sampled_followups(config: SyntheticConfig, catalog: _Catalog, rng: np.random.Generator) -> np.ndarray:
    """(N, K) follow-ups from the law of `_exact_followups` in O(N K log N) time and O(N K) memory.

    The first K distinct items of a sequence of independent weighted draws are distributed like the Gumbel top-K
    (both are weighted sampling without replacement, in draw order). A candidate's weight depends on the linking
    item only through its (category, brand) group, so a draw picks a target group from the source group's row of a
    (G, G) table (G <= 60 categories x 8 brands), then an item of that group by popularity. An item never draws
    itself (same category: weight 0). A link that keeps drawing taken items (fewer than K candidates carry nearly
    all the weight) repeats the strongest one after `_MAX_LINK_DRAWS` tries, as the exact builder does in a domain
    of too few items.
    """
    n = len(catalog.category)
    brand_slots = max(len(VOCABULARY[d].brands) for d in config.domains)
    num_groups = len(catalog.category_names) * brand_slots
    group = catalog.category * brand_slots + catalog.brand  # (N,) (category, brand) group of each item
    order = np.argsort(group, kind="stable")  # items by group
    group_pop = np.bincount(group, weights=catalog.popularity, minlength=num_groups)  # (G,)
    item_key = _group_cdf_keys(group[order], catalog.popularity[order] / group_pop[group[order]])

    all_groups = np.arange(num_groups)
    group_pair = (all_groups // brand_slots, all_groups % brand_slots)
    weight = _link_weight(config, catalog, group_pair, group_pair) * group_pop[None, :]  # (G, G), rows > 0
    table = weight / weight.sum(axis=1, keepdims=True)
    table_key = _group_cdf_keys(np.repeat(all_groups, num_groups), table.ravel())  # row a, column b at a * G + b

    def draw(rows: np.ndarray) -> np.ndarray:
        source = group[rows]
        flat = np.searchsorted(table_key, source + rng.random(len(rows)), side="right")
        target = np.minimum(flat - source * num_groups, num_groups - 1)
        position = np.searchsorted(item_key, target + rng.random(len(rows)), side="right")
        return order[np.minimum(position, n - 1)]

    followups = np.empty((n, config.num_followups), dtype=np.int64)
    for k in range(config.num_followups):
        todo = np.arange(n)
        for _ in range(_MAX_LINK_DRAWS):
            candidate = draw(todo)
            fresh = ~(candidate[:, None] == followups[todo, :k]).any(axis=1)
            followups[todo[fresh], k] = candidate[fresh]
            todo = todo[~fresh]
            if not todo.size:
                break
        followups[todo, k] = followups[todo, 0]
    return followups


def _item_factors(
    config: SyntheticConfig, catalog: _Catalog, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(N, F) latent item factors (a shared per-category part plus the item's own) and the (N,) quality bias."""
    cat_f = rng.normal(size=(len(catalog.category_names), config.latent_dim))  # (C, F)
    item_f = 0.6 * cat_f[catalog.category] + 0.8 * rng.normal(size=(len(catalog.category), config.latent_dim))
    return item_f, rng.normal(0.0, 0.5, size=len(catalog.category))


def _draw_users(config: SyntheticConfig, catalog: _Catalog, rng: np.random.Generator, num_users: int) -> _Users:
    """Lengths, start and end tastes, and latent factors of `num_users` users."""
    lengths = np.exp(rng.normal(np.log(config.length_median), config.length_sigma, size=num_users))
    lengths = np.clip(np.rint(lengths), config.min_length, config.max_length).astype(np.int64)  # (B,)

    # Tastes: domain preference x category share, then a sparse Dirichlet around it.
    domain_pref = rng.dirichlet(np.full(len(config.domains), config.domain_concentration), size=num_users)
    base = domain_pref[:, catalog.category_domain] * catalog.category_share[None, :]  # (B, C)

    def draw_taste() -> np.ndarray:
        g = rng.gamma(np.maximum(config.taste_concentration * base, 1e-3)) + 1e-12  # (B, C)
        return g / g.sum(axis=1, keepdims=True)

    taste_start = draw_taste()
    taste_end = (1.0 - config.taste_drift) * taste_start + config.taste_drift * draw_taste()
    return _Users(
        lengths=lengths,
        cdf_start=np.cumsum(taste_start, axis=1),
        cdf_end=np.cumsum(taste_end, axis=1),
        factors=rng.normal(size=(num_users, config.latent_dim)),
    )


def _affinity(
    config: SyntheticConfig, users: _Users, items: _ItemModel, rows: np.ndarray, cols: np.ndarray
) -> np.ndarray:
    """User-item affinity of users[rows] and items[cols] (broadcast): dot product / sqrt(F) + item quality."""
    return (users.factors[rows] * items.factors[cols]).sum(axis=-1) / np.sqrt(config.latent_dim) + items.quality[cols]


def _sample_rows(rng: np.random.Generator, cdf: np.ndarray) -> np.ndarray:
    """One categorical draw per row of a (R, C) row-wise CDF."""
    u = rng.random((cdf.shape[0], 1))
    return np.minimum((cdf < u * cdf[:, -1:]).sum(axis=1), cdf.shape[1] - 1)


def _walk(
    config: SyntheticConfig,
    catalog: _Catalog,
    items: _ItemModel,
    users: _Users,
    rng: np.random.Generator,
    new_session: np.ndarray | None,
) -> np.ndarray:
    """Walk the users at once, one step at a time; `new_session` (B, max_length) bool marks the events that start
    a session (where `session_reset_prob` applies), None = sessions do not shape the items.

    Returns:
        (B, T) items, -1 past each user's end.
    """
    num_users, lengths = len(users.lengths), users.lengths
    decay = config.followup_decay ** np.arange(config.num_followups)
    link_p = decay / decay.sum()  # (K,)
    horizon = int(lengths.max())
    walked = np.full((num_users, horizon), -1, dtype=np.int64)  # (B, T), -1 = past the end
    rows = np.arange(num_users)
    focus = _sample_rows(rng, users.cdf_start)  # (B,)
    for t in range(horizon):
        frac = t / np.maximum(lengths - 1, 1)  # (B,) position in the user's own sequence, 0..1
        use_end = rng.random(num_users) < frac
        switch = rng.random(num_users) < config.focus_switch_prob
        if new_session is not None:
            switch |= new_session[:, t] & (rng.random(num_users) < config.session_reset_prob)
        if t > 0 and switch.any():
            new = np.where(use_end, _sample_rows(rng, users.cdf_end), _sample_rows(rng, users.cdf_start))
            focus = np.where(switch, new, focus)
        # Taste draw: best of two popularity-drawn items of the focus category, chosen by affinity.
        cand = catalog.search_items(focus[:, None] + rng.random((num_users, 2)))
        cand = np.minimum(cand, len(catalog.category) - 1)  # (B, 2)
        aff = _affinity(config, users, items, rows[:, None], cand)
        score = config.affinity_choice * aff + rng.gumbel(size=cand.shape)
        choice = cand[rows, score.argmax(axis=1)]
        if t > 0:
            link = items.followups[walked[:, t - 1], rng.choice(config.num_followups, size=num_users, p=link_p)]
            follows = rng.random(num_users) < config.follow_prob
            if new_session is not None:
                follows &= ~new_session[:, t]
            choice = np.where(follows, link, choice)
        walked[:, t] = np.where(t < lengths, choice, -1)
    return walked


def _walk_by_length(
    config: SyntheticConfig,
    catalog: _Catalog,
    items: _ItemModel,
    users: _Users,
    rng: np.random.Generator,
    new_session: np.ndarray | None,
) -> np.ndarray:
    """`_walk` over `_LENGTH_GROUPS` groups of users of similar length, each only as far as its longest user: a
    block walked at once would step all its users to the longest length (3x the work at the default lengths)."""
    walked = np.full((len(users.lengths), int(users.lengths.max())), -1, dtype=np.int64)  # (B, T)
    for rows in np.array_split(np.argsort(users.lengths, kind="stable"), _LENGTH_GROUPS):
        if len(rows):
            flags = None if new_session is None else new_session[rows]
            group = _walk(config, catalog, items, users.take(rows), rng, flags)
            walked[rows, : group.shape[1]] = group
    return walked


def _timestamps(
    config: SyntheticConfig, lengths: np.ndarray, rng: np.random.Generator, new_session: np.ndarray | None
) -> np.ndarray:
    """(B, T) strictly increasing unix seconds: sessions of minutes-apart events, days between sessions
    (`new_session` (B, >= T) marks the session starts; None = drawn here)."""
    num_users, horizon = len(lengths), int(lengths.max())
    start = config.start_ts + rng.integers(0, config.span_days * _DAY, size=num_users)
    if new_session is None:
        in_session = rng.random((num_users, horizon)) < config.in_session_prob
    else:
        in_session = ~new_session[:, :horizon]
    short = rng.lognormal(np.log(180.0), 1.0, size=(num_users, horizon))  # median 3 minutes
    long = rng.exponential(3.0 * _DAY, size=(num_users, horizon)) + 3_600.0  # mean ~3 days
    gaps = np.maximum(np.where(in_session, short, long), 1.0).astype(np.int64)
    gaps[:, 0] = 0
    return start[:, None] + np.cumsum(gaps, axis=1)


def _session_starts(config: SyntheticConfig, rng: np.random.Generator, num_users: int) -> np.ndarray | None:
    """(B, max_length) bool: the events that start a session; None when sessions do not shape the items (then the
    timestamps draw them from the main stream, as they always did)."""
    if config.session_reset_prob == 0:
        return None
    return rng.random((num_users, config.max_length)) >= config.in_session_prob


def _interactions_frame(
    config: SyntheticConfig,
    catalog: _Catalog,
    items: _ItemModel,
    users: _Users,
    walked: np.ndarray,
    ts: np.ndarray,
    first_user: int,
    rng: np.random.Generator,
) -> pl.DataFrame:
    """The walked users' interactions with their labels, in the canonical schema, by user then time.

    Args:
        walked: (B, T) items, -1 past each user's end.
        ts: (B, T) timestamps.
        first_user: the number of the group's first user (its id is "u" + that number).
    """
    mask = walked >= 0  # (B, T) row-major flatten keeps each user's events in time order
    item_idx, ts = walked[mask], ts[mask]
    user_rows = np.repeat(np.arange(len(users.lengths)), users.lengths)
    aff = _affinity(config, users, items, user_rows, item_idx)  # flat: no (B, T, F) temporary
    m = len(item_idx)
    purchase = rng.random(m) < 1.0 / (1.0 + np.exp(-(config.purchase_base_logit + 1.5 * aff)))
    user_bias = rng.normal(0.0, 0.3, size=len(users.lengths))
    rating = 3.4 + 0.9 * aff + user_bias[user_rows] + rng.normal(0.0, config.rating_noise, size=m)

    width = max(5, len(str(config.num_users - 1)))
    user_ids = pl.Series([f"u{u:0{width}d}" for u in range(first_user, first_user + len(users.lengths))])
    return pl.DataFrame(
        {
            USER_ID: user_ids.gather(user_rows),
            ITEM_ID: catalog.item_ids.gather(item_idx),
            TS: ts.astype(np.int64),
            DOMAIN: pl.Series(config.domains).gather(catalog.domain[item_idx]),
            EVENT: pl.Series([CLICK, PURCHASE]).gather(purchase.astype(np.int64)),
            VALUE: np.clip(np.rint(rating), 1, 5).astype(np.float32),
        },
        schema=INTERACTION_SCHEMA,
    )


def _single_stream(config: SyntheticConfig) -> bool:
    """Whether the dataset is drawn from one random stream, all users at once (small sizes only: what every earlier
    version drew, so those datasets stay byte-identical), rather than catalog then user blocks."""
    return config.num_users <= SINGLE_STREAM_MAX_USERS and config.num_items <= SINGLE_STREAM_MAX_ITEMS


def _single_stream_interactions(
    config: SyntheticConfig, catalog: _Catalog, rng: np.random.Generator
) -> tuple[pl.DataFrame, np.ndarray]:
    """All interactions (and the users' lengths) from the stream that drew the catalog, in its historical order."""
    followups = _exact_followups(config, catalog, rng)
    new_session = _session_starts(config, np.random.default_rng([config.seed, _SESSION_STREAM]), config.num_users)
    users = _draw_users(config, catalog, rng, config.num_users)
    items = _ItemModel(followups, *_item_factors(config, catalog, rng))
    walked = _walk(config, catalog, items, users, rng, new_session)
    ts = _timestamps(config, users.lengths, rng, new_session)
    return _interactions_frame(config, catalog, items, users, walked, ts, 0, rng), users.lengths


def _block_interactions(
    config: SyntheticConfig, catalog: _Catalog, items: _ItemModel, block: int
) -> tuple[pl.DataFrame, np.ndarray]:
    """The interactions (and lengths) of user block `block`, from its own streams: no other block changes them."""
    first_user = block * USERS_PER_BLOCK
    num_users = min(USERS_PER_BLOCK, config.num_users - first_user)
    rng = np.random.default_rng([config.seed, _USER_STREAM, block])
    new_session = _session_starts(config, np.random.default_rng([config.seed, _SESSION_STREAM, block]), num_users)
    users = _draw_users(config, catalog, rng, num_users)
    walked = _walk_by_length(config, catalog, items, users, rng, new_session)
    ts = _timestamps(config, users.lengths, rng, new_session)
    return _interactions_frame(config, catalog, items, users, walked, ts, first_user, rng), users.lengths


def _user_groups(config: SyntheticConfig) -> Iterator[tuple[pl.DataFrame, np.ndarray]]:
    """The interactions of consecutive groups of users, with the group's lengths: the single stream as one group,
    or the user blocks one by one."""
    progress = Progress(logger, f"synthetic seed={config.seed}", total=config.num_users, unit="users")
    rng = np.random.default_rng(config.seed)
    catalog = _build_catalog(config, rng)
    if _single_stream(config):
        frame, lengths = _single_stream_interactions(config, catalog, rng)
        progress.update(done=config.num_users, rows=frame.height)
        yield frame, lengths
    else:
        items = _ItemModel(_sampled_followups(config, catalog, rng), *_item_factors(config, catalog, rng))
        logger.info("synthetic: catalog of %d items and their follow-ups built", config.num_items)
        for block in range(-(-config.num_users // USERS_PER_BLOCK)):
            frame, lengths = _block_interactions(config, catalog, items, block)
            progress.update(done=min((block + 1) * USERS_PER_BLOCK, config.num_users), rows=frame.height)
            yield frame, lengths
    logger.info(
        "synthetic seed=%d: %d users, %d items, %d interactions (mean length %.1f)",
        config.seed, config.num_users, config.num_items, progress.rows, progress.rows / config.num_users,
    )  # fmt: skip
    progress.finish()


def _regroup(groups: Iterator[tuple[pl.DataFrame, np.ndarray]], users_per_chunk: int) -> Iterator[pl.DataFrame]:
    """Frames of exactly `users_per_chunk` users (the last may hold fewer) from groups of users of any size, given
    each group's frame (rows by user) and its users' lengths."""
    held_frames: list[pl.DataFrame] = []
    held_lengths = np.empty(0, dtype=np.int64)  # of the users not yet yielded
    for frame, lengths in groups:
        held_frames.append(frame)
        held_lengths = np.concatenate([held_lengths, lengths])
        if len(held_lengths) < users_per_chunk:
            continue
        held = pl.concat(held_frames)
        cuts = np.cumsum(held_lengths)[users_per_chunk - 1 :: users_per_chunk]  # row end of each full chunk
        for start, end in itertools.pairwise([0, *cuts.tolist()]):
            yield held.slice(start, end - start)
        held_frames = [held.slice(int(cuts[-1]))]
        held_lengths = held_lengths[len(cuts) * users_per_chunk :]
    if len(held_lengths):
        yield pl.concat(held_frames)


def iter_synthetic(config: SyntheticConfig, users_per_chunk: int = 100_000) -> Iterator[pl.DataFrame]:
    """The synthetic interactions, `users_per_chunk` users at a time, in the schema of `generate_synthetic`.

    The rows do not depend on `users_per_chunk`: above the single-stream sizes every block of `USERS_PER_BLOCK`
    users draws from its own stream (seed, block), so memory holds the catalog, one block's arrays and the chunk
    (~35 bytes per interaction), however many users there are. Below them the dataset is drawn whole, then split.
    Streamed to parquet on 2 CPU cores (the generate step of the scale benchmark, docs/scale.md): 10^6 users x 10^5
    items (16.6M interactions) in 24 s at 0.49 GiB peak RSS; 10^7 users x 10^6 items (166M) in 261 s at 0.76 GiB.

    Args:
        config: sizes and knobs.
        users_per_chunk: users per yielded frame (the last may hold fewer).

    Raises:
        ConfigError: users_per_chunk < 1.

    Example:
        >>> config = SyntheticConfig(num_users=20, num_items=200, seed=1)
        >>> [chunk["user_id"].n_unique() for chunk in iter_synthetic(config, users_per_chunk=8)]
        [8, 8, 4]
    """
    if users_per_chunk < 1:
        raise ConfigError(f"users_per_chunk={users_per_chunk!r} must be at least 1")
    return _regroup(_user_groups(config), users_per_chunk)


def synthetic_items(config: SyntheticConfig) -> pl.DataFrame:
    """The item catalog of the dataset `config` describes (item_id, title, domain, category, brand), alone.

    It is the first thing the seed's stream draws, so it costs no follow-ups and no users.
    """
    return _items_frame(config, _build_catalog(config, np.random.default_rng(config.seed)))


def generate_synthetic(config: SyntheticConfig) -> RawDataset:
    """Generate the synthetic dataset described in this module's docstring, whole (`iter_synthetic` streams it).

    Args:
        config: sizes and knobs; the same config always gives identical frames.

    Returns:
        RawDataset(source="synthetic") with
        interactions: user_id str ("u00017"), item_id str ("i00042"), ts int64 (unix seconds, strictly
        increasing per user), domain str, event str ("click" | "purchase"), value float32 (rating 1..5),
        sorted by user_id then ts;
        items: item_id, title, domain, category, brand (all str), one row per catalog item.

    Example:
        >>> ds = generate_synthetic(SyntheticConfig(num_users=20, num_items=200, seed=1))
        >>> ds.interactions.columns
        ['user_id', 'item_id', 'ts', 'domain', 'event', 'value']
        >>> ds.interactions.group_by("user_id").len()["len"].min() >= 5
        True
        >>> ds.items.height, ds.items.columns
        (200, ['item_id', 'title', 'domain', 'category', 'brand'])
        >>> len(ds.items["title"][0].split()) >= 4
        True
    """
    interactions = pl.concat((frame for frame, _ in _user_groups(config)), rechunk=True)
    return RawDataset(interactions=interactions, items=synthetic_items(config), source="synthetic")
