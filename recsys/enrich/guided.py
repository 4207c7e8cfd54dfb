"""Guided decoding: a causal LM fills the values of a JSON skeleton the code writes, so every answer parses.

A `Skeleton` is the record's grammar as a list of segments: literal text (forced token by token), a choice among
fixed strings (category: a token is allowed only while it continues one of them), a free string (any token without a
quote, backslash, newline or special meaning, until the model closes it with a token `X"T` whose tail `T` starts
what may follow), and a list of free strings with a minimum and maximum count. A free string may be *grounded*:
it is then a span of the item's own text, from a word's start to a word's end, case aside (keywords that repeat
what the text says, never invent).

`GuidedDecoder.fill` runs greedy decoding over a batch of prompts with a KV cache: the shared prompt prefix (the
few-shot examples) is run once and its cache copied to every row, then each row's own suffix (padding between the two
is masked), then one token per row per step (a forced one, or the best allowed one). Positions are counted over real
tokens only, so a padded row sees the same positions as it would alone (padded batches with default positions give
degenerate output). A free string stops at its token cap (then it is closed by force and counted as `truncated`); a
token that would repeat a trigram of the same value is not allowed, nor a list value opening with the first token of
an earlier one (small models loop otherwise); a `sentence` value is closed after its first full stop.

Dimension letters: B rows, T prompt tokens, V vocabulary.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger(__name__)

QUOTE = '"'
OPTION_ROWS = 64  # (row, option) pairs of one whole-choice scoring pass: bound its memory (their keys, values, states)
_SPACE_PIECE = "\u2581"  # SentencePiece's space


@dataclass(frozen=True)
class Literal:
    text: str


@dataclass(frozen=True)
class Choice:
    """One of `options` (the closing quote is written by the skeleton after it). Token by token (the best allowed
    token at each step), or, with `whole`, the option the model finds most likely as a whole: the sum of its
    tokens' log-probabilities, closing quote included, so a first token shared by many options (`Beauty`) does not
    decide alone."""

    options: tuple[str, ...]
    whole: bool = False


@dataclass(frozen=True)
class Free:
    """A free string value; the skeleton wrote its opening quote and writes what follows its closing one."""

    name: str
    max_tokens: int
    grounded: bool = False  # only tokens of the item's own text
    sentence: bool = False  # closed right after its first full stop


@dataclass(frozen=True)
class FreeList:
    """`min_count` to `max_count` free strings inside `[" ... "]`, joined by `", "`."""

    item: Free
    min_count: int
    max_count: int


Segment = Literal | Choice | Free | FreeList
_Context = tuple[Any, torch.Tensor, torch.Tensor]  # the batch's (KV cache, attention mask (B, T), positions (B, t))


@dataclass(frozen=True)
class Skeleton:
    """The record as segments. Literals around a value include its quotes, e.g. `{"brand": "`, Free, `", `..."""

    segments: tuple[Segment, ...]


@dataclass
class Filled:
    """One row's answer: the JSON text, and the values cut at their token cap."""

    text: str
    truncated: list[str] = field(default_factory=list)


class Vocabulary:
    """The token strings of a tokenizer, and the masks the decoder needs, computed once."""

    def __init__(self, tokenizer: Any, device: torch.device, size: int) -> None:
        """`size`: the output layer's rows (V); rows past the tokenizer's tokens (padding some releases add to
        the embedding matrix) have no text and are never allowed."""
        if size < len(tokenizer):
            raise ValueError(f"the output layer has {size} rows for a tokenizer of {len(tokenizer)} tokens. "
                             "Fix: load the tokenizer that belongs to the model")  # fmt: skip
        self.tokenizer = tokenizer
        self.device = device
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        special = set(tokenizer.all_special_ids)
        self.texts: list[str | None] = [
            None if i in special or piece is None else _piece_text(piece) for i, piece in enumerate(pieces)
        ] + [None] * (size - len(tokenizer))
        self.ids = {text: i for i, text in enumerate(self.texts) if text}
        self.lower_ids: dict[str, list[int]] = {}  # a plain token's lower-cased text -> the tokens with it
        for i, text in enumerate(self.texts):
            if text is not None and _is_plain(text):
                self.lower_ids.setdefault(text.lower(), []).append(i)
        plain = [t is not None and _is_plain(t) for t in self.texts]
        self.plain = torch.tensor(plain, dtype=torch.bool, device=device)
        self._closing: dict[tuple[str, ...], torch.Tensor] = {}

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def closing(self, follows: tuple[str, ...]) -> torch.Tensor:
        """(V,) bool: tokens `X"T`, X quote-free and printable, T a prefix of one of `follows`."""
        if follows not in self._closing:
            mask = torch.zeros(len(self.texts), dtype=torch.bool)
            for i, text in enumerate(self.texts):
                if text and QUOTE in text:
                    head, _, tail = text.partition(QUOTE)
                    if (head == "" or _is_plain(head)) and any(option.startswith(tail) for option in follows):
                        mask[i] = True
            self._closing[follows] = mask.to(self.device)
        return self._closing[follows]


def _is_plain(text: str) -> bool:
    """A token a JSON string value may hold as it is: printable, no quote or backslash."""
    return bool(text) and text.isprintable() and '"' not in text and "\\" not in text


def _piece_text(piece: str) -> str | None:
    if piece.startswith("<0x") and piece.endswith(">"):  # a byte of a character the vocabulary lacks: never needed
        return None
    return piece.replace(_SPACE_PIECE, " ")


_SEPARATOR = ', "'  # between two values of a list (after the closing quote of the first)


@dataclass
class _Row:
    """Where one row is in its skeleton: forcing text, choosing among options, or writing a free value."""

    source: str = ""  # the item's own text, lower-cased: what a grounded value is a span of
    segment: int = 0
    mode: str = "force"  # force | choice | free | done
    forced: list[int] = field(default_factory=list)
    then: tuple[str, int] = ("enter", 0)  # after the forced tokens: ("enter", segment) | ("value", 0) | ("follow", 0)
    options: tuple[str, ...] = ()
    option_pos: int = 0
    value: list[int] = field(default_factory=list)  # tokens of the free value under way
    count: int = 0  # values of the current list closed
    openers: set[int] = field(default_factory=set)  # first tokens of the current list's values: not used twice
    follows: tuple[str, ...] = ()  # what may come after the free value under way's closing quote
    text: str = ""
    truncated: list[str] = field(default_factory=list)


class GuidedDecoder:
    """Greedy, batched, skeleton-guided decoding over a Hugging Face causal LM (module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, device: torch.device) -> None:
        self.body, self.head = model.base_model, model.get_output_embeddings()  # argmax needs no logit soft-cap
        self.vocab, self.device = Vocabulary(tokenizer, device, self.head.weight.shape[0]), device
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.bos_id = tokenizer.bos_token_id
        self._prefix: tuple[str, Any, int] | None = None
        # transformers 5 names the KV cache `cache` (argument and output), earlier releases `past_key_values`: the
        # pinned install has the first, preinstalled GPU images may have the second
        takes = inspect.signature(self.body.forward).parameters
        self._cache_name = "cache" if "cache" in takes else "past_key_values"

    @torch.inference_mode()
    def fill(self, prefix: str, suffixes: Sequence[str], skeleton: Skeleton, texts: Sequence[str]) -> list[Filled]:
        """Each prompt (`prefix` + its suffix) with the skeleton filled in; `texts` are the items' own texts (what
        grounded values may use). The prefix is run once per decoder and shared (rows are laid out prefix, padding,
        suffix: the padding is masked and positions count real tokens, so every row sees its prompt unpadded)."""
        rows = [_Row(source=" ".join(text.split()).lower()) for text in texts]
        for row in rows:
            self._enter(row, skeleton, 0)
        cache, prefix_length = self._prefix_cache(prefix, len(rows))
        encoded = [self.vocab.encode(suffix) for suffix in suffixes]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention = torch.ones((len(rows), prefix_length + width), dtype=torch.long)
        positions = torch.zeros((len(rows), width), dtype=torch.long)
        for b, ids in enumerate(encoded):
            input_ids[b, width - len(ids) :] = torch.tensor(ids)
            attention[b, prefix_length : prefix_length + width - len(ids)] = 0
            positions[b, width - len(ids) :] = torch.arange(prefix_length, prefix_length + len(ids))
        input_ids, attention, positions = (
            input_ids.to(self.device),
            attention.to(self.device),
            positions.to(self.device),
        )
        hidden, cache = self._run(input_ids, attention, positions, cache)
        while True:
            self._choose_whole(rows, skeleton, hidden, (cache, attention, positions))
            chosen = self._choose(rows, skeleton, hidden)
            for row, token in zip(rows, chosen, strict=True):
                if row.mode != "done":
                    self._advance(row, skeleton, token)
            if all(row.mode == "done" for row in rows):
                break
            step = torch.tensor(chosen, dtype=torch.long, device=self.device)[:, None]
            attention = torch.cat([attention, torch.ones_like(step)], dim=1)
            positions = positions[:, -1:] + 1
            hidden, cache = self._run(step, attention, positions, cache)
        return [Filled(row.text, row.truncated) for row in rows]

    def _prefix_cache(self, prefix: str, rows: int) -> tuple[Any, int]:
        """The prefix's KV cache, repeated for `rows` rows (computed once per prefix), and its length."""
        if self._prefix is None or self._prefix[0] != prefix:
            ids = ([self.bos_id] if self.bos_id is not None else []) + self.vocab.encode(prefix)
            tokens = torch.tensor([ids], device=self.device)
            _, cache = self._run(
                tokens, torch.ones_like(tokens), torch.arange(len(ids), device=self.device)[None], None
            )
            self._prefix = (prefix, cache, len(ids))
        cache = copy.deepcopy(self._prefix[1])
        cache.batch_repeat_interleave(rows)
        return cache, self._prefix[2]

    def _run(
        self, ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, Any]:
        """The body of the model over `ids`: (the last position's hidden state (B, H), the cache)."""
        states, cache = self._forward(ids, attention, positions, cache)
        return states[:, -1], cache

    def _forward(
        self, ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, Any]:
        """The body over `ids` (B, L) after `cache`: (the hidden states (B, L, H), the cache grown by L)."""
        out = self.body(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True,
                        **{self._cache_name: cache})  # fmt: skip
        return out.last_hidden_state, getattr(out, self._cache_name)

    # -- choosing the next token ------------------------------------------------------------------------------

    def _choose_whole(self, rows: list[_Row], skeleton: Skeleton, hidden: torch.Tensor, context: _Context) -> None:
        """Every row that has just entered a `whole` choice: its most likely option, forced from here."""
        entering = [b for b, row in enumerate(rows) if row.mode == "choice" and row.option_pos == 0
                    and isinstance(choice := skeleton.segments[row.segment], Choice) and choice.whole]  # fmt: skip
        for options in {rows[b].options for b in entering}:
            group = [b for b in entering if rows[b].options == options]
            encoded = [self.vocab.encode(option) for option in options]  # each ends with its closing quote
            per_pass = max(1, OPTION_ROWS // len(options))
            for start in range(0, len(group), per_pass):
                part = group[start : start + per_pass]
                scores = self._option_log_likelihoods(part, encoded, hidden, context)  # (len(part), K)
                for b, best in zip(part, scores.argmax(dim=1).tolist(), strict=True):
                    self._chosen(rows[b], skeleton, options[best], written=0)

    def _option_log_likelihoods(
        self, part: list[int], encoded: list[list[int]], hidden: torch.Tensor, context: _Context
    ) -> torch.Tensor:
        """(len(part), K) float: log p(option | the row's context) of every row of `part` and option of `encoded`."""
        cache, attention, positions = context
        options, longest = len(encoded), max(len(ids) for ids in encoded)
        tokens = torch.full((options, longest), self.pad_id, dtype=torch.long)
        real = torch.zeros((options, longest), dtype=torch.bool)
        for k, ids in enumerate(encoded):
            tokens[k, : len(ids)], real[k, : len(ids)] = torch.tensor(ids), True
        tokens, real = tokens.to(self.device), real.to(self.device)
        first = torch.log_softmax(self.head(hidden[part]).float(), dim=-1)[:, tokens[:, 0]]  # (P, K)
        if longest == 1:
            return first
        rows = torch.tensor(part, device=self.device).repeat_interleave(options)  # (P*K,) row of each pair
        shared = _selected(cache, rows)
        steps = tokens[:, :-1].repeat(len(part), 1)  # (P*K, L-1): each option's tokens but its last, as input
        mask = torch.cat([attention[rows], real[:, :-1].repeat(len(part), 1).long()], dim=1)
        at = positions[rows, -1:] + 1 + torch.arange(longest - 1, device=self.device)
        hidden_steps, _ = self._forward(steps, mask, at, shared)
        states = hidden_steps.view(len(part), options, longest - 1, -1)
        # options share their first tokens (`Beauty > `): the output layer, most of the cost, runs once per distinct
        # context, and each (option, step) reads its context's row
        index: dict[tuple[int, ...], int] = {}  # a context (the option tokens before a step) -> its number
        where: list[tuple[int, int]] = []  # an (option, step) of each context
        of_step = torch.zeros((options, longest - 1), dtype=torch.long)  # the context of each (option, step)
        for k, ids in enumerate(encoded):
            for i in range(1, len(ids)):
                if (key := tuple(ids[:i])) not in index:
                    index[key] = len(where)
                    where.append((k, i - 1))
                of_step[k, i - 1] = index[key]
        first_of = torch.tensor(where, device=self.device)  # (C, 2)
        logits = self.head(states[:, first_of[:, 0], first_of[:, 1]]).float()  # (P, C, V)
        log_norm = logits.logsumexp(dim=-1)  # (P, C)
        of_step = of_step.to(self.device)
        following = tokens[:, 1:]  # (K, L-1): the token each step predicts
        picked = logits[:, of_step, following] - log_norm[:, of_step]  # (P, K, L-1)
        rest = (picked * real[:, 1:]).sum(dim=2)
        return first + rest

    def _choose(self, rows: list[_Row], skeleton: Skeleton, hidden: torch.Tensor) -> list[int]:
        """The next token of every row: its forced one, else its best allowed one (a finished row: padding). The
        output layer runs only for the rows that choose (a forced token needs no logits)."""
        chosen = [self.pad_id if row.mode == "done" else row.forced[0] if row.mode == "force" else -1 for row in rows]
        choosing = [b for b, token in enumerate(chosen) if token == -1]
        if choosing:
            logits = self.head(hidden[choosing]).float()
            for j, b in enumerate(choosing):
                logits[j].masked_fill_(~self._allowed(rows[b], skeleton), float("-inf"))
            for b, token in zip(choosing, logits.argmax(dim=-1).tolist(), strict=True):
                chosen[b] = token
        return chosen

    def _allowed(self, row: _Row, skeleton: Skeleton) -> torch.Tensor:
        """(V,) bool: the tokens `row` may take now."""
        if row.mode == "choice":
            ids = [self.vocab.ids[prefix] for option in row.options
                   for prefix in _prefixes(option[row.option_pos :]) if prefix in self.vocab.ids]  # fmt: skip
            if not ids:  # no single token starts what is left: the first token of its own encoding does
                ids = [self.vocab.encode(row.options[0][row.option_pos :])[0]]
            mask = torch.zeros_like(self.vocab.plain)
            mask[ids] = True
            return mask
        closing = self.vocab.closing(row.follows)
        free = _free(skeleton.segments[row.segment])
        value = "".join(self.vocab.texts[t] or "" for t in row.value)
        if free.grounded:
            spans, ends = _span_continuations(row.source, value.lower())
            mask = torch.zeros_like(self.vocab.plain)
            mask[[i for prefix in spans for i in self.vocab.lower_ids.get(prefix, ())]] = True
            mask |= closing if row.value and ends else mask & False
            if not mask.any():  # nothing of the text fits any more: close the value
                mask = closing if row.value else self.vocab.plain.clone()
        elif free.sentence and _ends_sentence(value):
            return closing  # one sentence
        else:
            mask = self.vocab.plain | closing if row.value else self.vocab.plain.clone()  # no empty values
        banned = _repeating(row.value) | (row.openers if not row.value else set())  # a list does not repeat itself
        if banned:
            mask = mask.clone()
            mask[list(banned)] = False
        return mask

    # -- consuming it -----------------------------------------------------------------------------------------

    def _advance(self, row: _Row, skeleton: Skeleton, token: int) -> None:
        if row.mode == "force":
            row.forced.pop(0)
            if not row.forced:
                self._then(row, skeleton)
            return
        piece = self.vocab.texts[token] or ""
        row.text += piece
        if row.mode == "choice":
            row.options = tuple(o for o in row.options if o[row.option_pos :].startswith(piece))
            row.option_pos += len(piece)
            written = [o for o in row.options if len(o) == row.option_pos]
            if written:
                self._chosen(row, skeleton, written[0])
            return
        if QUOTE in piece:
            self._close_value(row, skeleton, piece.partition(QUOTE)[2])
            return
        if not row.value:
            row.openers.add(token)
        row.value.append(token)
        free = _free(skeleton.segments[row.segment])
        if len(row.value) >= free.max_tokens:  # cut: close it by force
            row.truncated.append(free.name)
            self._force(row, skeleton, QUOTE, ("follow", 0))

    def _close_value(self, row: _Row, skeleton: Skeleton, tail: str) -> None:
        """The free value under way is closed, and `tail` of what follows it is already written."""
        row.value = []
        row.count += 1
        options = tuple(o for o in row.follows if o.startswith(tail))
        if len(options) == 1:
            self._chosen(row, skeleton, options[0], written=len(tail))
        else:
            row.mode, row.options, row.option_pos = "choice", options, len(tail)

    def _chosen(self, row: _Row, skeleton: Skeleton, option: str, written: int | None = None) -> None:
        """`option` is what comes next; `written` of it (all, by default) is already written."""
        rest = option[len(option) if written is None else written :]
        if isinstance(skeleton.segments[row.segment], Choice):
            self._force(row, skeleton, rest, ("enter", row.segment + 1))
        elif option == _SEPARATOR and isinstance(skeleton.segments[row.segment], FreeList):
            self._force(row, skeleton, rest, ("value", 0))
        else:  # the value or list is over; `option` holds the literal after it
            self._force(row, skeleton, rest, ("enter", row.segment + 2))

    def _force(self, row: _Row, skeleton: Skeleton, text: str, then: tuple[str, int]) -> None:
        row.text += text
        row.forced, row.then = (self.vocab.encode(text) if text else []), then
        if row.forced:
            row.mode = "force"
        else:
            self._then(row, skeleton)

    def _then(self, row: _Row, skeleton: Skeleton) -> None:
        kind, index = row.then
        if kind == "enter":
            self._enter(row, skeleton, index)
        elif kind == "value":
            self._start_value(row, skeleton)
        else:  # a value closed by force: its quote is written, what follows is not
            self._close_value(row, skeleton, "")

    def _enter(self, row: _Row, skeleton: Skeleton, index: int) -> None:
        if index >= len(skeleton.segments):
            row.mode = "done"
            return
        row.segment, segment = index, skeleton.segments[index]
        if isinstance(segment, Literal):
            self._force(row, skeleton, segment.text, ("enter", index + 1))
        elif isinstance(segment, Choice):
            row.mode, row.options, row.option_pos = "choice", tuple(o + QUOTE for o in segment.options), 0
        else:
            row.count, row.openers = 0, set()
            self._start_value(row, skeleton)

    def _start_value(self, row: _Row, skeleton: Skeleton) -> None:
        segment = skeleton.segments[row.segment]
        after = skeleton.segments[row.segment + 1] if row.segment + 1 < len(skeleton.segments) else None
        closer = after.text if isinstance(after, Literal) else ""
        row.mode, row.value = "free", []
        row.follows = _list_follows(segment, row.count, closer) if isinstance(segment, FreeList) else (closer,)


def _selected(cache: Any, rows: torch.Tensor) -> Any:
    """A cache of `rows` of `cache` (rows may repeat) that leaves `cache` as it is: its layers are copied shallowly
    and re-pointed at the selected rows, so the running batch's keys and values are read, never written."""
    selected = copy.copy(cache)
    selected.layers = [copy.copy(layer) for layer in cache.layers]
    selected.batch_select_indices(rows)
    return selected


def _free(segment: Segment) -> Free:
    if isinstance(segment, FreeList):
        return segment.item
    assert isinstance(segment, Free), f"not a free value: {segment}"
    return segment


def _span_continuations(source: str, value: str, longest: int = 24) -> tuple[set[str], bool]:
    """How a grounded value may go on: the texts that continue `value` as a span of `source` (both lower-case) from a
    word's start (up to `longest` characters ahead), and whether `value` ends where a word of `source` ends."""
    continuations: set[str] = set()
    ends = False
    start = 0
    while (at := source.find(value, start)) != -1:
        start = at + 1
        if (at > 0 and source[at - 1].isalnum()) or (not value and at > 0 and source[at - 1] != " "):
            continue  # not a word's start
        after = at + len(value)
        ends = ends or after == len(source) or not source[after].isalnum()
        ahead = source[after : after + longest]
        if not value:
            ahead = ahead.lstrip()
        continuations.update(ahead[:end] for end in range(1, len(ahead) + 1))
    return continuations, ends


def _ends_sentence(text: str) -> bool:
    """Whether `text` ends a sentence of at least three words (not a decimal point: "1." of "1.7 oz")."""
    text = text.rstrip()
    return text.endswith((".", "!", "?")) and not text[-2:-1].isdigit() and len(text.split()) >= 3


def _prefixes(text: str) -> list[str]:
    return [text[:end] for end in range(1, len(text) + 1)]


def _list_follows(segment: FreeList, closed: int, closer: str) -> tuple[str, ...]:
    """What may follow the list's next value (`closed` are already written): another one, the list's end, or either."""
    end = "]" + closer
    if closed + 1 < segment.min_count:
        return (_SEPARATOR,)
    if closed + 1 >= segment.max_count:
        return (end,)
    return (_SEPARATOR, end)


def _repeating(value: list[int]) -> set[int]:
    """Tokens that would repeat a trigram already in `value`."""
    if len(value) < 2:
        return set()
    last = (value[-2], value[-1])
    return {value[i + 2] for i in range(len(value) - 2) if (value[i], value[i + 1]) == last}
