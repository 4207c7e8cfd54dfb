"""The packaged local model (Gemma 3 270M, from its PyPI package) writes records for three items on the CPU: every
answer parses and passes the record's checks, keywords are spans of the item's own text, and the category is one of
the prompt's; a batch writes what each item alone writes. The GGUF file is converted once into a cache that later
runs reuse (about a minute and a half)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import polars as pl
import torch

from recsys.enrich.cache import EnrichCache
from recsys.enrich.guided import Choice, Free, GuidedDecoder, Literal, Skeleton
from recsys.enrich.local import LocalBackend
from recsys.enrich.record import load_prompt
from recsys.enrich.run import enrich_catalogue

MODELS = Path(os.environ.get("RECSYS_TEST_CACHE", Path.home() / ".cache" / "recsys-tests")) / "enrich"
TITLES = [
    "Burt's Bees Beeswax Lip Balm, 4 Tubes",
    "Remington Pearl Pro Ceramic 1 1/2 Inch Curling Iron",
    "Maybelline New York Great Lash Mascara, Blackest Black",
]


def test_the_packaged_model_writes_three_valid_grounded_records(tmp_path: Path) -> None:
    backend = LocalBackend(cache_dir=MODELS, device="cpu")
    prompt = load_prompt()
    out = tmp_path / "item_metadata.parquet"
    summary = enrich_catalogue(["a", "b", "c"], TITLES, backend, prompt, EnrichCache(tmp_path), out, batch_size=3)
    assert (summary.ok, summary.failed, summary.valid_fraction) == (3, 0, 1.0)
    assert summary.model.startswith("gemma-3-270m-q4_k_m@")
    assert summary.load_seconds > 0.5  # the model's load, timed apart from the answers' items/s
    for row, title in zip(pl.read_parquet(out).iter_rows(named=True), TITLES, strict=True):
        words = " ".join(re.findall(r"\S+", title.lower()))
        assert row["category"] in prompt.categories and row["description"] and 2 <= len(row["queries"]) <= 3
        assert all(keyword.lower() in words for keyword in row["keywords"]), (row["keywords"], title)


def test_a_batch_writes_what_each_item_alone_writes() -> None:
    """Rows of a batch are padded between the shared prefix and their own suffix, masked, with positions counted over
    real tokens: greedy decoding must not notice (padded batches with default positions gave degenerate output). Two
    titles of different lengths: one row is padded."""
    backend = LocalBackend(cache_dir=MODELS, device="cpu")
    prompt = load_prompt()
    titles = TITLES[:2]
    together = backend.generate(titles, prompt)
    alone = [backend.generate([title], prompt)[0] for title in titles]
    assert [g.text for g in together] == [g.text for g in alone]


OPTIONS = ("Beauty > Skin Care", "Beauty > Hair Care", "Beauty > Makeup", "Home > Kitchen & Dining", "Other")


def _option_log_likelihood(decoder: GuidedDecoder, context: str, option: str) -> float:
    """log p(option + closing quote | context), the whole sequence run from scratch (no cache, no padding)."""
    head = [decoder.bos_id, *decoder.vocab.encode(context)]
    tail = decoder.vocab.encode(option + '"')
    ids = torch.tensor([head + tail])
    with torch.inference_mode():
        states = decoder.body(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        log_probs = torch.log_softmax(decoder.head(states[0, len(head) - 1 : -1]).float(), dim=-1)
    return float(log_probs[torch.arange(len(tail)), torch.tensor(tail)].sum())


def test_a_whole_choice_is_the_option_most_likely_as_a_whole_and_leaves_the_batch_as_it_was() -> None:
    """In a padded batch, each row's whole-option choice is the argmax of its options' log-likelihoods computed from
    scratch, and what the row writes after it is what it writes when that option is the only one (the scoring pass
    reads the batch's cache and never writes it)."""
    decoder = LocalBackend(cache_dir=MODELS, device="cpu").decoder
    prefix = "Shop categories: " + "; ".join(OPTIONS) + ".\n\nItem:"
    suffixes = [f" {title}\nCategory:" for title in TITLES]

    def filled(choices: list[Choice]) -> list[str]:
        return [decoder.fill(prefix, [suffix], Skeleton((Literal(' "'), choice, Literal(' Brand: "'),
                Free("brand", 6))), [title])[0].text for suffix, title, choice in zip(suffixes, TITLES, choices,
                strict=True)]  # fmt: skip

    batch = decoder.fill(prefix, suffixes, Skeleton((Literal(' "'), Choice(OPTIONS, whole=True), Literal(' Brand: "'),
                         Free("brand", 6))), TITLES)  # fmt: skip
    chosen = [next(o for o in OPTIONS if f.text.startswith(f' "{o}"')) for f in batch]
    for suffix, option in zip(suffixes, chosen, strict=True):
        scores = {o: _option_log_likelihood(decoder, prefix + suffix + ' "', o) for o in OPTIONS}
        assert option == max(scores, key=scores.__getitem__), scores
    assert [f.text for f in batch] == filled([Choice((option,)) for option in chosen])
