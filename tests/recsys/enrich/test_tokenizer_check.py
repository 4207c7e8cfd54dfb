"""The model's tokenizer as the decoder meets it: a converted tokenizer that lost its merges (one token per
character) is refused before it reaches the decoder, with the fix; a subword one passes; output rows past the
tokenizer are never chosen. Real `tokenizers` tokenizers behind transformers' fast wrapper."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from recsys.enrich.guided import Vocabulary
from recsys.enrich.local import PROBE, _check_tokenizer
from recsys.errors import ConfigError


def _wrapped(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def test_a_tokenizer_of_single_characters_is_refused_with_the_fix() -> None:
    characters = sorted(set(PROBE))
    merges_lost = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(characters)}, merges=[]))
    with pytest.raises(ConfigError, match=r"the tokenizer at M splits text into characters \('The quick.*': 43 tokens"
                       r" for 43 characters\); transformers .* lost its merges. Fix: install the pinned transformers"
                       r" \(`make setup`\), then delete M"):  # fmt: skip
        _check_tokenizer(_wrapped(merges_lost), "the tokenizer at M", "delete M")


def test_a_subword_tokenizer_passes() -> None:
    words = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(PROBE.split())}, unk_token="The"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    wrapped = _wrapped(words)
    assert len(wrapped.encode(PROBE, add_special_tokens=False)) == 9
    _check_tokenizer(wrapped, "the tokenizer at M", "delete M")  # 9 tokens for 43 characters: kept


def test_output_rows_past_the_tokenizer_are_never_allowed() -> None:
    """Models pad their output layer past the tokenizer (Gemma 3 by one row in some releases, Qwen by hundreds):
    the decoder's vocabulary covers every row, those rows without text, so no mask is narrower than the logits."""
    wrapped = _wrapped(Tokenizer(models.WordLevel(vocab={"a": 0, "b": 1, "c": 2}, unk_token="a")))
    vocab = Vocabulary(wrapped, torch.device("cpu"), size=5)
    assert vocab.texts[3:] == [None, None] and vocab.plain.tolist() == [True, True, True, False, False]
    with pytest.raises(ValueError, match=r"the output layer has 2 rows for a tokenizer of 3 tokens"):
        Vocabulary(wrapped, torch.device("cpu"), size=2)
