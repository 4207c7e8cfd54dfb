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

Letters used in shape comments: U users, N items, C categories, K follow-ups per item, T max length,
F latent dimension.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

import numpy as np
import polars as pl

from features.raw import RawDataset
from recsys.data.schema import DOMAIN, EVENT, ITEM_ID, TITLE, TS, USER_ID, VALUE
from recsys.errors import ConfigError

logger = logging.getLogger(__name__)

CLICK, PURCHASE = "click", "purchase"


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
    cdf_key: np.ndarray  # (N,) float, category + within-category CDF: searchsorted(cat + u) samples
    titles: list[str]
    category_names: list[str]  # (C,)
    category_domain: np.ndarray  # (C,) int
    category_share: np.ndarray  # (C,) float, share of its domain's traffic, sums to 1 per domain


def _zipf_weights(rng: np.random.Generator, n: int, exponent: float) -> np.ndarray:
    """Weights 1 / rank^exponent over a random permutation of ranks, normalised to sum 1."""
    ranks = rng.permutation(n) + 1
    w = 1.0 / ranks.astype(np.float64) ** exponent
    return w / w.sum()


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

    cat = np.concatenate(category)
    pop = np.concatenate(popularity)
    cdf_key = np.empty_like(pop)
    starts = np.r_[0, np.flatnonzero(np.diff(cat)) + 1, len(cat)]
    for lo, hi in itertools.pairwise(starts):
        local = np.cumsum(pop[lo:hi])
        local[-1] = 1.0  # exact, so that category c's keys lie in (c, c + 1]
        cdf_key[lo:hi] = cat[lo] + local
    dom, brd = np.concatenate(domain), np.concatenate(brand)
    return _Catalog(
        domain=dom,
        category=cat,
        brand=brd,
        popularity=pop,
        cdf_key=cdf_key,
        titles=_make_titles(config, dom, brd, [category_names[c] for c in cat], rng),
        category_names=category_names,
        category_domain=np.asarray(category_domain),
        category_share=np.concatenate(category_share),
    )


def _make_titles(
    config: SyntheticConfig, domain: np.ndarray, brand: np.ndarray, nouns: list[str], rng: np.random.Generator
) -> list[str]:
    """'Brand Style Variant Noun' per item; up to three redraws avoid most duplicate titles."""
    titles: list[str] = []
    used: set[str] = set()
    n = len(nouns)
    styles = rng.random((n, 4))  # up to 4 tries of (style, variant) per item
    variants = rng.random((n, 4))
    for i in range(n):
        vocab = VOCABULARY[config.domains[domain[i]]]
        head, noun = f"{vocab.brands[brand[i]]} ", nouns[i]
        for attempt in range(4):
            style = vocab.styles[int(styles[i, attempt] * len(vocab.styles))]
            variant = vocab.variants[int(variants[i, attempt] * len(vocab.variants))]
            title = f"{head}{style} {variant} {noun}"
            if title not in used:
                break
        used.add(title)
        titles.append(title)
    return titles


def _build_followups(config: SyntheticConfig, catalog: _Catalog, rng: np.random.Generator) -> np.ndarray:
    """(N, K) follow-up items per item, drawn without replacement (Gumbel top-K) within the domain.

    Candidate weight = popularity * category factor (paired category 1, same category 0, other category
    `followup_other_category`) * (`followup_same_brand` if same brand). The K links are ordered, so
    link 0 is the strongest.
    """
    n, k = len(catalog.category), config.num_followups
    followups = np.empty((n, k), dtype=np.int64)  # (N, K)
    first_of_domain = np.searchsorted(catalog.category_domain, catalog.category_domain)  # (C,)
    cat_local = np.arange(len(first_of_domain)) - first_of_domain  # index within its domain
    local_cat = cat_local[catalog.category]  # (N,); pairs are (0, 1), (2, 3), ...
    log_pop = np.log(catalog.popularity)
    for d in range(len(config.domains)):
        members = np.flatnonzero(catalog.domain == d)  # (M,)
        kk = min(k, len(members) - 1)
        for lo in range(0, len(members), 512):  # row chunks keep memory at 512 x M
            rows = members[lo : lo + 512]  # (R,)
            same_cat = catalog.category[rows][:, None] == catalog.category[members][None, :]  # (R, M)
            paired = (local_cat[rows][:, None] ^ 1) == local_cat[members][None, :]
            same_brand = catalog.brand[rows][:, None] == catalog.brand[members][None, :]
            cat_factor = np.where(paired, 1.0, np.where(same_cat, 0.0, config.followup_other_category))
            weight = cat_factor * np.where(same_brand, config.followup_same_brand, 1.0)
            weight[rows[:, None] == members[None, :]] = 0.0  # never link to itself
            with np.errstate(divide="ignore"):
                key = np.log(weight) + log_pop[members][None, :] + rng.gumbel(size=weight.shape)
            top = np.argsort(-key, axis=1, kind="stable")[:, :kk]  # (R, kk), strongest first
            followups[rows, :kk] = members[top]
            followups[rows, kk:] = members[top[:, :1]]  # tiny domains: repeat the strongest link
    return followups


def _sample_rows(rng: np.random.Generator, cdf: np.ndarray) -> np.ndarray:
    """One categorical draw per row of a (R, C) row-wise CDF."""
    u = rng.random((cdf.shape[0], 1))
    return np.minimum((cdf < u * cdf[:, -1:]).sum(axis=1), cdf.shape[1] - 1)


def _simulate(
    config: SyntheticConfig,
    catalog: _Catalog,
    followups: np.ndarray,
    rng: np.random.Generator,
    new_session: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Walk all users at once, one step at a time; `new_session` (U, max_length) bool marks the events that start
    a session (where `session_reset_prob` applies), None = sessions do not shape the items.

    Returns:
        lengths (U,), items (U, T) with -1 past each user's end, and the user-item affinity (U, T).
    """
    num_users, num_cats = config.num_users, len(catalog.category_names)
    lengths = np.exp(rng.normal(np.log(config.length_median), config.length_sigma, size=num_users))
    lengths = np.clip(np.rint(lengths), config.min_length, config.max_length).astype(np.int64)  # (U,)

    # Tastes: domain preference x category share, then a sparse Dirichlet around it.
    domain_pref = rng.dirichlet(np.full(len(config.domains), config.domain_concentration), size=num_users)
    base = domain_pref[:, catalog.category_domain] * catalog.category_share[None, :]  # (U, C)

    def draw_taste() -> np.ndarray:
        g = rng.gamma(np.maximum(config.taste_concentration * base, 1e-3)) + 1e-12  # (U, C)
        return g / g.sum(axis=1, keepdims=True)

    taste_start = draw_taste()
    taste_end = (1.0 - config.taste_drift) * taste_start + config.taste_drift * draw_taste()
    cdf_start, cdf_end = np.cumsum(taste_start, axis=1), np.cumsum(taste_end, axis=1)  # (U, C)

    user_f = rng.normal(size=(num_users, config.latent_dim))  # (U, F)
    cat_f = rng.normal(size=(num_cats, config.latent_dim))  # (C, F)
    item_f = 0.6 * cat_f[catalog.category] + 0.8 * rng.normal(size=(len(catalog.category), config.latent_dim))
    quality = rng.normal(0.0, 0.5, size=len(catalog.category))  # (N,)

    def affinity(users: np.ndarray, items: np.ndarray) -> np.ndarray:
        return (user_f[users] * item_f[items]).sum(axis=-1) / np.sqrt(config.latent_dim) + quality[items]

    decay = config.followup_decay ** np.arange(config.num_followups)
    link_p = decay / decay.sum()  # (K,)
    horizon = int(lengths.max())
    items = np.full((num_users, horizon), -1, dtype=np.int64)  # (U, T), -1 = past the end
    users = np.arange(num_users)
    focus = _sample_rows(rng, cdf_start)  # (U,)
    for t in range(horizon):
        frac = t / np.maximum(lengths - 1, 1)  # (U,) position in the user's own sequence, 0..1
        use_end = rng.random(num_users) < frac
        switch = rng.random(num_users) < config.focus_switch_prob
        if new_session is not None:
            switch |= new_session[:, t] & (rng.random(num_users) < config.session_reset_prob)
        if t > 0 and switch.any():
            new = np.where(use_end, _sample_rows(rng, cdf_end), _sample_rows(rng, cdf_start))
            focus = np.where(switch, new, focus)
        # Taste draw: best of two popularity-drawn items of the focus category, chosen by affinity.
        cand = np.searchsorted(catalog.cdf_key, focus[:, None] + rng.random((num_users, 2)), side="right")
        cand = np.minimum(cand, len(catalog.category) - 1)  # (U, 2)
        score = config.affinity_choice * affinity(users[:, None], cand) + rng.gumbel(size=cand.shape)
        choice = cand[users, score.argmax(axis=1)]
        if t > 0:
            link = followups[items[:, t - 1], rng.choice(config.num_followups, size=num_users, p=link_p)]
            follows = rng.random(num_users) < config.follow_prob
            if new_session is not None:
                follows &= ~new_session[:, t]
            choice = np.where(follows, link, choice)
        items[:, t] = np.where(t < lengths, choice, -1)
    return lengths, items, affinity(users[:, None], np.maximum(items, 0))  # last: (U, T)


def _timestamps(
    config: SyntheticConfig, lengths: np.ndarray, rng: np.random.Generator, new_session: np.ndarray | None = None
) -> np.ndarray:
    """(U, T) strictly increasing unix seconds: sessions of minutes-apart events, days between sessions
    (`new_session` (U, >= T) marks the session starts; None = drawn here)."""
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


def generate_synthetic(config: SyntheticConfig) -> RawDataset:
    """Generate the synthetic dataset described in this module's docstring.

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
    started = time.perf_counter()
    rng = np.random.default_rng(config.seed)
    catalog = _build_catalog(config, rng)
    followups = _build_followups(config, catalog, rng)
    new_session = None
    if config.session_reset_prob > 0:  # its own stream: the default data keeps every draw of the main one
        session_rng = np.random.default_rng([config.seed, 1])
        new_session = session_rng.random((config.num_users, config.max_length)) >= config.in_session_prob
    lengths, items, aff = _simulate(config, catalog, followups, rng, new_session)
    ts = _timestamps(config, lengths, rng, new_session)

    mask = items >= 0  # (U, T) row-major flatten keeps each user's events in time order
    item_idx, aff_flat, ts_flat = items[mask], aff[mask], ts[mask]
    user_idx = np.repeat(np.arange(config.num_users), lengths)
    m = len(item_idx)
    purchase = rng.random(m) < 1.0 / (1.0 + np.exp(-(config.purchase_base_logit + 1.5 * aff_flat)))
    user_bias = rng.normal(0.0, 0.3, size=config.num_users)
    rating = 3.4 + 0.9 * aff_flat + user_bias[user_idx] + rng.normal(0.0, config.rating_noise, size=m)

    uw, iw = max(5, len(str(config.num_users - 1))), max(5, len(str(len(catalog.category) - 1)))
    item_ids = np.array([f"i{i:0{iw}d}" for i in range(len(catalog.category))])
    domain_names = np.array(config.domains)
    interactions = pl.DataFrame(
        {
            USER_ID: np.array([f"u{u:0{uw}d}" for u in range(config.num_users)])[user_idx],
            ITEM_ID: item_ids[item_idx],
            TS: ts_flat.astype(np.int64),
            DOMAIN: domain_names[catalog.domain[item_idx]],
            EVENT: np.where(purchase, PURCHASE, CLICK),
            VALUE: np.clip(np.rint(rating), 1, 5).astype(np.float32),
        },
        schema={USER_ID: pl.String, ITEM_ID: pl.String, TS: pl.Int64, DOMAIN: pl.String,
                EVENT: pl.String, VALUE: pl.Float32},
    )  # fmt: skip
    brands = [VOCABULARY[config.domains[d]].brands[b] for d, b in zip(catalog.domain, catalog.brand, strict=True)]
    items_df = pl.DataFrame(
        {
            ITEM_ID: item_ids,
            TITLE: catalog.titles,
            DOMAIN: domain_names[catalog.domain],
            "category": np.array(catalog.category_names)[catalog.category],
            "brand": brands,
        },
        schema={
            ITEM_ID: pl.String,
            TITLE: pl.String,
            DOMAIN: pl.String,
            "category": pl.String,
            "brand": pl.String,
        },
    )
    elapsed = time.perf_counter() - started
    logger.info(
        "synthetic seed=%d: %d users, %d items, %d interactions (mean length %.1f) in %.2fs",
        config.seed, config.num_users, items_df.height, m, m / config.num_users, elapsed,
    )  # fmt: skip
    return RawDataset(interactions=interactions, items=items_df, source="synthetic")
