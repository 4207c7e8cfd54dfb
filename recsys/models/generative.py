"""TIGER-style generative retrieval (Rajput et al., NeurIPS 2023): predict the next item's semantic ID.

The encoder reads an optional hashed user token and the semantic-ID tokens of the user's most recent items;
the decoder emits the next item's code tuple one level at a time. Decoding is a beam search constrained by a
trie of the catalog's semantic IDs, so every returned tuple is a real item.

Tokens: 0 = padding, 1 = decoder start, then one block of K_t code tokens per level t. The user token has
its own table: user_idx modulo `user_buckets` (+1; row 0 = unknown user), as TIGER hashes users into 2,000 tokens.
Dimension letters: B users, H history items, T code levels, S = 1 + H * T encoder tokens, D dim, W beams.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from torch import nn

from recsys.data.schema import PADDING_IDX
from recsys.data.times import HistoryTimes
from recsys.models.family import Input, Model, ModelFamily, ModelInputs, Rebuild, semantic_ids_of
from recsys.modules.encoder_decoder import EncoderDecoder
from recsys.modules.transformer import most_recent
from recsys.runtime.validation import Fraction, check_heads
from recsys.semantic_ids.trie import SemanticIdTrie

PAD_TOKEN, START_TOKEN, FIRST_CODE_TOKEN = 0, 1, 2


@dataclass(frozen=True)
class GenerativeConfig:
    num_items: int  # V
    codebook_sizes: tuple[int, ...]  # K_t per level, the de-duplication level included
    max_history: PositiveInt = 20  # most recent items the encoder reads (TIGER: 20)
    dim: PositiveInt = 128
    num_encoder_layers: PositiveInt = 4
    num_decoder_layers: PositiveInt = 4
    num_heads: PositiveInt = 4
    ffn_dim: PositiveInt = 1024
    dropout: Fraction = 0.1
    beam_size: PositiveInt = 50  # >= the largest k evaluated
    user_buckets: NonNegativeInt = 2000  # hashed user tokens (TIGER: 2,000); 0 = no user token
    # Of the W items returned, this many are reserved for items marked new (`mark_new_items`): the model was
    # never trained to emit them, so they would rarely reach the beam (TIGER's epsilon * K). 0 = off.
    new_item_slots: NonNegativeInt = 0
    # Dense re-scoring of the generated items (COBRA's sparse-then-dense cascade, Yang et al. 2025, "Sparse Meets
    # Dense", and its BeamFusion): the decoder's state after an item's T codes is a dense query, trained against a
    # learned vector per item (cosine / dense_temperature, a softmax over the catalogue: one more head beside the
    # levels'); a generated item scores its log-probability + dense_weight x its dense log-probability. 0 = no dense
    # head (TIGER's model).
    dense_weight: NonNegativeFloat = 0.0
    dense_temperature: PositiveFloat = 0.05
    # Dense retrieval beside the beam (after LIGER, Yang et al. 2024, "Unifying Generative and Dense Retrieval for
    # Sequential Recommendation", which re-ranks the beam by a dense head; this one also proposes items): the
    # decoder's start state, before any code, is also a query against a learned vector per item (dot products, a
    # softmax over the catalogue: one more head beside the levels'); its `retrieval_candidates` best items join the
    # beam's W, and every candidate scores its sequence log-probability + retrieval_weight x its retrieval
    # log-probability, so items the beam misses can still rank. Item vectors are IDs: keep it off where new items
    # must rank (cold start). 0 = off.
    retrieval_candidates: NonNegativeInt = 0
    retrieval_weight: NonNegativeFloat = 1.0
    # the encoder's and decoder's matmuls in beam search (`generate`: validation, test, serving): "bf16" runs them
    # under bf16 autocast, the beams' log-probabilities still summed in fp32; "fp32" (the default) as trained to
    # compare. benchmarks.generative_speed measures each one's validation time and metrics on one trained model.
    beam_precision: Literal["fp32", "bf16"] = "fp32"
    # Popularity correction of the decoding, alpha: every code's log-probability less alpha x the log of the share
    # of training interactions it holds among its prefix's (counts + 1), so an item scores log p(item) - alpha x
    # log q(item), q its share of the training counts. Full cross-entropy reproduces training's popularity, and
    # later targets are less popular (benchmarks.target_drift); choose alpha on validation. 0 = off.
    popularity_correction: NonNegativeFloat = 0.0

    def __post_init__(self) -> None:
        check_heads(self.num_heads, self.dim)
        if self.new_item_slots > self.beam_size:
            raise ValueError(
                f"new_item_slots: {self.new_item_slots} is more than beam_size ({self.beam_size}); reserve fewer "
                "slots or widen the beam"
            )
        if self.new_item_slots and self.retrieval_candidates:
            raise ValueError(
                "retrieval_candidates with new_item_slots: the retrieval head's item vectors are IDs, never trained "
                "for new items, so it would rank them at random; set one of the two to 0"
            )


class GenerativeRetriever(Model[GenerativeConfig]):
    """Encoder-decoder transformer over semantic-ID tokens with trie-constrained beam search.

    Args:
        config: sizes; `codebook_sizes` must match the codes.
        codes: (V+1, T) int64 semantic ID of every item_idx (row 0, the padding item, is ignored).
    """

    codes: torch.Tensor  # (V+1, T) buffer
    offsets: torch.Tensor  # (T,) buffer: first token id of every level
    new_items: torch.Tensor  # (V+1,) bool buffer: items added after training (cold start)
    item_weights: torch.Tensor  # (V+1,) buffer with `popularity_correction`: training count + 1 of every item

    def __init__(self, config: GenerativeConfig, codes: torch.Tensor) -> None:
        super().__init__(config)
        T = len(config.codebook_sizes)
        if codes.shape != (config.num_items + 1, T):
            raise ValueError(
                f"codes must be (num_items + 1, {T}) = ({config.num_items + 1}, {T}), got {tuple(codes.shape)}"
            )
        self.register_buffer("codes", codes.long().clone())
        self.register_buffer("new_items", torch.zeros(config.num_items + 1, dtype=torch.bool))
        if config.popularity_correction:
            self.register_buffer("item_weights", torch.ones(config.num_items + 1))
        sizes = torch.tensor(config.codebook_sizes)
        self.register_buffer("offsets", FIRST_CODE_TOKEN + torch.cumsum(sizes, 0) - sizes)  # (T,) first token per level
        vocab = FIRST_CODE_TOKEN + int(sizes.sum())
        self.token_emb = nn.Embedding(vocab, config.dim, padding_idx=PAD_TOKEN)
        self.slot_emb = nn.Embedding(config.max_history, config.dim)  # history slot, counted from the most recent
        self.level_emb = nn.Embedding(T + 1, config.dim)  # code level of a token (decoder: T = the start token)
        self.user_emb = nn.Embedding(config.user_buckets + 1, config.dim) if config.user_buckets else None
        if config.dense_weight:
            self.item_emb = nn.Embedding(config.num_items + 1, config.dim)  # the dense head's vector per item
            self.dense_query = nn.Linear(config.dim, config.dim)
        if config.retrieval_candidates:
            self.retrieval_item_emb = nn.Embedding(config.num_items + 1, config.dim)  # the retrieval head's
            self.retrieval_query = nn.Linear(config.dim, config.dim)
        self.transformer = EncoderDecoder(
            config.dim, config.num_heads, config.num_encoder_layers, config.num_decoder_layers, config.ffn_dim,
            config.dropout,
        )  # fmt: skip
        self._tries: dict[str, SemanticIdTrie] = {}
        self._shares: dict[str, tuple[torch.Tensor, ...]] = {}  # per trie: its conditional_log_shares

    @property
    def max_history(self) -> int:
        return self.config.max_history

    @property
    def levels(self) -> int:
        return len(self.config.codebook_sizes)

    @property
    def dense(self) -> bool:
        """Whether the model has the dense head (`dense_weight` > 0)."""
        return self.config.dense_weight > 0

    @property
    def retrieves(self) -> bool:
        """Whether the model has the dense retrieval head (`retrieval_candidates` > 0)."""
        return self.config.retrieval_candidates > 0

    def head_targets(self, items: torch.Tensor) -> torch.Tensor:
        """(B,) item_idx -> (B, T [+ 1] [+ 1]) what each training head predicts: the items' semantic IDs, then the
        items themselves once per item head (dense, retrieval) (`recsys.training.recipes.GenerativeModel`)."""
        items = items.to(self.codes.device)
        item_heads = int(self.dense) + int(self.retrieves)
        return torch.cat([self.codes[items], items[:, None].expand(-1, item_heads)], dim=1)

    def mark_new_items(self, new: torch.Tensor) -> None:
        """(V+1,) bool: items to serve through the `new_item_slots` reserved slots (e.g. the cold-start items)."""
        self.new_items.copy_(new.to(self.new_items.device).bool())
        self.new_items[PADDING_IDX] = False
        self._tries.clear()
        self._shares.clear()

    def set_item_counts(self, counts: torch.Tensor) -> None:
        """(V+1,) training count of every item, which `popularity_correction` divides by (+ 1: a never-trained item
        has weight 1)."""
        if not self.config.popularity_correction:
            raise ValueError("set_item_counts: popularity_correction is 0, so the model keeps no counts")
        if counts.shape != self.item_weights.shape or bool((counts < 0).any()):
            raise ValueError(f"item counts must be (V+1,) = {tuple(self.item_weights.shape)} and >= 0, got "
                             f"{tuple(counts.shape)}")  # fmt: skip
        self.item_weights.copy_(counts.to(self.item_weights) + 1)
        self._shares.clear()

    def with_decoding(
        self,
        counts: torch.Tensor,
        *,
        popularity_correction: float,
        retrieval_weight: float,
        retrieval_candidates: int,
    ) -> GenerativeRetriever:
        """This trained model decoding with other decoding settings (`popularity_correction` alpha over the training
        `counts` (V+1,); with the retrieval head, its `retrieval_weight` and `retrieval_candidates` K >= 1): the same
        weights (shared), so they can be chosen on validation without training again."""
        retrieval = (retrieval_weight, retrieval_candidates)
        if not self.retrieves and retrieval != (self.config.retrieval_weight, 0):
            raise ValueError("with_decoding: retrieval_weight and retrieval_candidates need the retrieval head "
                             "(retrieval_candidates > 0), which this model was trained without")  # fmt: skip
        if self.retrieves and retrieval_candidates < 1:
            raise ValueError(f"with_decoding: retrieval_candidates {retrieval_candidates} with the retrieval head: "
                             "give 1 or more (its weights are there to use)")  # fmt: skip
        changed = replace(self.config, popularity_correction=popularity_correction, retrieval_weight=retrieval_weight,
                          retrieval_candidates=retrieval_candidates)  # fmt: skip
        decoding = GenerativeRetriever(changed, self.codes)
        weights = self.state_dict(keep_vars=True)
        weights.pop("item_weights", None)  # the counts are set below
        missing, unexpected = decoding.load_state_dict(weights, strict=False, assign=True)
        if unexpected or set(missing) - {"item_weights"}:
            raise ValueError(f"with_decoding: the weights differ (missing {missing}, unexpected {unexpected})")
        decoding.to(self.codes.device)
        if popularity_correction:
            decoding.set_item_counts(counts)
        return decoding.train(self.training)

    def _log_shares(self, subset: Literal["all", "old", "new"]) -> tuple[torch.Tensor, ...] | None:
        """The item weights' `conditional_log_shares` in the trie of `subset`; None without popularity_correction."""
        if not self.config.popularity_correction:
            return None
        trie = self.trie(subset)
        cached = self._shares.get(subset)
        if cached is None or cached[0].device != trie.radix.device:
            cached = self._shares[subset] = trie.conditional_log_shares(self.item_weights.to(trie.radix.device))
        return cached

    def trie(self, subset: Literal["all", "old", "new"] = "all") -> SemanticIdTrie:
        """The trie of the semantic IDs of all items, of the items not marked new, or of the new ones.

        Built once per subset, on the model's device.
        """
        cached = self._tries.get(subset)
        if cached is None or cached.radix.device != self.codes.device:
            items = torch.arange(1, self.config.num_items + 1)
            if subset != "all":
                new = self.new_items[1:].cpu()
                items = items[new if subset == "new" else ~new]
            trie = SemanticIdTrie.build(self.codes.cpu()[items], items, list(self.config.codebook_sizes))
            cached = self._tries[subset] = trie.to(self.codes.device)
        return cached

    def encode(self, histories: torch.Tensor, users: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L) left-padded item_idx [+ (B,) user_idx, 0 = unknown] -> memory (B, S, D), padding mask (B, S)."""
        histories = most_recent(histories.to(self.codes.device), self.config.max_history)
        B, H = histories.shape
        tokens = self.offsets + self.codes[histories]  # (B, H, T)
        tokens = tokens.masked_fill((histories == PADDING_IDX)[..., None], PAD_TOKEN)
        slots = torch.arange(H - 1, -1, -1, device=tokens.device)[:, None].expand(H, self.levels)  # (H, T)
        levels = torch.arange(self.levels, device=tokens.device)[None, :].expand(H, self.levels)
        x = self.token_emb(tokens) + self.slot_emb(slots) + self.level_emb(levels)  # (B, H, T, D)
        x, pad = x.reshape(B, H * self.levels, -1), tokens.reshape(B, H * self.levels) == PAD_TOKEN
        if self.user_emb is not None:
            user = self.user_emb(self._user_buckets(users, B))  # (B, D)
            x, pad = torch.cat([user[:, None], x], dim=1), F.pad(pad, (1, 0), value=False)
        else:
            pad[:, -1] = False  # an empty history still leaves one (padding) token to attend to
        return self.transformer.encode(x, pad), pad

    def _user_buckets(self, users: torch.Tensor | None, batch: int) -> torch.Tensor:
        """(B,) user token ids: 1 + (user_idx - 1) mod user_buckets, 0 for unknown users (user_idx 0 or None)."""
        if users is None:
            return torch.zeros(batch, dtype=torch.long, device=self.codes.device)
        users = users.to(self.codes.device).long()
        return torch.where(users > 0, 1 + (users - 1) % self.config.user_buckets, 0)

    def decode(self, memory: torch.Tensor, memory_pad: torch.Tensor, prefix_codes: torch.Tensor) -> torch.Tensor:
        """Decoder states for the next level of G code prefixes per user (beams, or candidate items).

        Args:
            memory, memory_pad: from `encode`, (B, S, D) and (B, S).
            prefix_codes: (B * G, t) codes of levels 0..t-1 already chosen (t may be 0), a user's G rows together.

        Returns:
            (B * G, t + 1, D) decoder states; position i predicts level i.
        """
        N, t = prefix_codes.shape
        start = torch.full((N, 1), START_TOKEN, dtype=torch.long, device=memory.device)
        tokens = torch.cat([start, self.offsets[:t] + prefix_codes], dim=1)  # (B * G, t+1)
        levels = (torch.arange(t + 1, device=memory.device) - 1) % (self.levels + 1)  # the start token's is T
        return self.transformer.decode(self.token_emb(tokens) + self.level_emb(levels), memory, memory_pad)

    def level_logits(self, states: torch.Tensor, level: int) -> torch.Tensor:
        """(..., D) decoder states -> (..., K_level) logits over that level's codes (tied embeddings)."""
        sizes = self.config.codebook_sizes
        start = FIRST_CODE_TOKEN + sum(sizes[:level])  # from the config, not the `offsets` buffer: no device read
        return states @ self.token_emb.weight[start : start + sizes[level]].T

    def forward(
        self, histories: torch.Tensor, targets: torch.Tensor, users: torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """Teacher-forced training pass.

        Args:
            histories: (B, L) left-padded item_idx.
            targets: (B,) the next item_idx.
            users: (B,) user_idx (0 = unknown), or None.

        Returns:
            T tensors of logits, (B, K_t) each, for the target's code at every level; with the dense head, then the
            (B, V+1) item logits of the query that follows the target's codes; with the retrieval head, then the
            (B, V+1) item logits of the start state's query.
        """
        memory, pad = self.encode(histories, users)
        codes = self.codes[targets.to(self.codes.device)]  # (B, T)
        states = self.decode(memory, pad, codes if self.dense else codes[:, :-1])  # (B, T [+ 1], D)
        logits = [self.level_logits(states[:, t], t) for t in range(self.levels)]
        if self.dense:
            logits.append(self.dense_logits(states[:, self.levels]))
        if self.retrieves:
            logits.append(self.retrieval_logits(states[:, 0]))
        return logits

    def retrieval_logits(self, start_states: torch.Tensor) -> torch.Tensor:
        """(N, D) decoder start states -> (N, V+1) dot products of their retrieval query with every item's vector."""
        return self.retrieval_query(start_states) @ self.retrieval_item_emb.weight.T

    @torch.no_grad()
    def retrieved(
        self, memory: torch.Tensor, pad: torch.Tensor, beam_items: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The retrieval head's `retrieval_candidates` best items the beam did not return, and every item's retrieval
        log-probability: (B, K) item_idx (0 where it repeats a beam item), (B, V+1) log-probs (padding -inf)."""
        start = self.decode(memory, pad, beam_items.new_zeros(len(beam_items), 0))[:, 0]  # (B, D)
        log_probs = F.log_softmax(self.retrieval_logits(start).float(), dim=-1)
        log_probs[:, PADDING_IDX] = float("-inf")
        top = log_probs.topk(min(self.config.retrieval_candidates, self.config.num_items), dim=1).indices
        repeats = (top[:, :, None] == beam_items[:, None, :]).any(dim=2)
        return top.masked_fill(repeats, PADDING_IDX), log_probs

    def dense_logits(self, states: torch.Tensor) -> torch.Tensor:
        """(N, D) decoder states after T codes -> (N, V+1) cosine / dense_temperature against every item's vector."""
        queries = F.normalize(self.dense_query(states), dim=-1)
        return queries @ F.normalize(self.item_emb.weight, dim=-1).T / self.config.dense_temperature

    @torch.no_grad()
    def dense_log_probs(self, memory: torch.Tensor, pad: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """(B, M) item_idx -> (B, M) each item's dense log-probability given the user and its own semantic ID
        (softmax over the catalogue); 0 (no item) scores -inf."""
        B, M = items.shape
        codes = self.codes[items].reshape(B * M, self.levels).clamp(min=0)  # the padding item's codes are -1
        states = self.decode(memory, pad, codes)[:, self.levels]  # (B * M, D)
        log_probs = F.log_softmax(self.dense_logits(states).float(), dim=-1)  # (B * M, V+1)
        own = log_probs.gather(1, items.reshape(B * M, 1)).view(B, M)
        return own.masked_fill(items == PADDING_IDX, float("-inf"))

    @torch.no_grad()
    def generate(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, beam_size: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Constrained beam search.

        With `new_item_slots` = s > 0 and items marked new, the W results are the best W - s items that are
        not new plus the best s new items (each found by a beam search over its own trie), all ranked by
        their log-probability under the whole catalog's trie. With the retrieval head, its best items join them
        (`retrieved`), each scored by that log-probability + `retrieval_weight` x its retrieval log-probability,
        and the best W of them all are kept. With the dense head, the items are ranked by their score +
        `dense_weight` x their dense log-probability (`dense_log_probs`).

        Args:
            histories: (B, L) left-padded item_idx.
            users: (B,) user_idx (0 = unknown), or None.
            beam_size: W (default `config.beam_size`).

        Returns:
            items (B, W) item_idx best first (0 where fewer than W items exist), log-probs (B, W).
        """
        W = beam_size or self.config.beam_size
        precision = (  # fp32: as the caller runs it (an autocast around the call still applies)
            torch.autocast(self.codes.device.type, dtype=torch.bfloat16)
            if self.config.beam_precision == "bf16"
            else contextlib.nullcontext()
        )
        with precision:
            memory, pad = self.encode(histories, users)
            slots = min(self.config.new_item_slots, W)
            if not slots or not bool(self.new_items.any()):
                items, scores = self._beam_search(memory, pad, "all", W)
            else:
                old, _ = self._beam_search(memory, pad, "old", W - slots)
                new, _ = self._beam_search(memory, pad, "new", slots)
                items = torch.cat([old, new], dim=1)  # (B, W)
                scores = self.sequence_log_probs(memory, pad, items)
            if self.retrieves:
                more, retrieval = self.retrieved(memory, pad, items)  # (B, K), (B, V+1)
                scores = torch.cat([scores, self.sequence_log_probs(memory, pad, more)], dim=1)
                items = torch.cat([items, more], dim=1)  # (B, W + K), no item twice
                if self.config.retrieval_weight:  # at 0 the term is skipped: 0 x -inf (no item) would be NaN
                    scores = scores + self.config.retrieval_weight * retrieval.gather(1, items)
            if self.dense:
                scores = scores + self.config.dense_weight * self.dense_log_probs(memory, pad, items)
        scores, order = scores.float().sort(dim=1, descending=True)
        return items.gather(1, order[:, :W]), scores[:, :W]

    def _beam_search(
        self, memory: torch.Tensor, pad: torch.Tensor, subset: Literal["all", "old", "new"], W: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Beam search of width W over the trie of `subset` -> items (B, W) best first (0 = none), log-probs (B, W)
        (less the popularity correction).

        The first level decodes one beam per user (the only live one), the later ones W."""
        trie, shares = self.trie(subset), self._log_shares(subset)
        alpha = self.config.popularity_correction
        B = memory.shape[0]
        scores = torch.zeros(B, 1, device=memory.device)  # (B, live beams)
        keys = torch.zeros(B, 1, dtype=torch.long, device=memory.device)
        prefix = torch.zeros(B, 1, 0, dtype=torch.long, device=memory.device)  # (B, live beams, t) chosen codes
        for t in range(self.levels):
            live = scores.shape[1]
            states = self.decode(memory, pad, prefix.reshape(B * live, t))[:, -1]  # (B * live, D)
            logits = self.level_logits(states, t).float().view(B, live, -1)  # (B, live, K_t)
            rows = trie.rows(t, keys)  # (B, live)
            logits = logits.masked_fill(~trie.allowed[t][rows], float("-inf"))
            total = scores[..., None] + F.log_softmax(logits, dim=-1)  # (B, live, K_t)
            if shares is not None:
                total = total - alpha * shares[t][rows]
            K = total.shape[-1]
            scores, flat = total.view(B, -1).topk(min(W, live * K), dim=1)  # (B, W) once K_0 >= W
            beam, code = flat // K, flat % K
            keys = keys.gather(1, beam) * K + code
            prefix = torch.cat([prefix.gather(1, beam[..., None].expand(-1, -1, t)), code[..., None]], dim=2)
        items = trie.items(keys).masked_fill(scores == float("-inf"), PADDING_IDX)
        short = W - items.shape[1]  # a catalogue with fewer than W items
        return F.pad(items, (0, short), value=PADDING_IDX), F.pad(scores, (0, short), value=float("-inf"))

    @torch.no_grad()
    def sequence_log_probs(self, memory: torch.Tensor, pad: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        """Log-probability of each item's semantic ID under trie-constrained decoding of the whole catalog.

        Args:
            memory, pad: from `encode`, (B, S, D) and (B, S).
            items: (B, M) item_idx; 0 (no item) scores -inf.

        Returns:
            (B, M), the scores beam search over `trie()` gives these items (less the popularity correction).
        """
        B, M = items.shape
        trie, codes = self.trie(), self.codes[items].reshape(B * M, self.levels)  # (B*M, T)
        states = self.decode(memory, pad, codes[:, :-1])  # (B * M, T, D)
        total = torch.zeros(B * M, device=memory.device)
        keys = torch.zeros(B * M, dtype=torch.long, device=memory.device)
        rows = torch.arange(B * M, device=memory.device)
        for t in range(self.levels):
            code = codes[:, t].clamp(min=0)  # the padding item's codes are -1
            logits = self.level_logits(states[:, t], t).float()
            logits = logits.masked_fill(~trie.allowed_next(t, keys), float("-inf"))
            total += F.log_softmax(logits, dim=-1)[rows, code]
            keys = keys * self.config.codebook_sizes[t] + code
        total = total.view(B, M)
        if self.config.popularity_correction:  # the sum of the levels' corrections: alpha x log q(item)
            weights = self.item_weights.to(total.device)
            total = total - self.config.popularity_correction * (weights[items] / weights[1:].sum()).log()
        return total.masked_fill(items == PADDING_IDX, float("-inf"))

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) histories [+ (B,) users] -> (B, V+1): beam log-probs of the W generated items, -inf elsewhere
        (`times` are ignored).

        Ranking metrics at k <= W are exact; items outside the beam count as misses.
        """
        items, scores = self.generate(histories, users)
        out = torch.full((items.shape[0], self.config.num_items + 1), float("-inf"), device=items.device)
        out.scatter_(1, items, scores)
        out[:, PADDING_IDX] = float("-inf")
        return out


def _build(fields: dict[str, Any], inputs: ModelInputs) -> GenerativeRetriever:
    sids = semantic_ids_of(inputs, FAMILY.name, fields["num_items"])
    model = GenerativeRetriever(FAMILY.validate({**fields, "codebook_sizes": sids.codebook_sizes}), sids.codes)
    if inputs.new_items is not None:
        model.mark_new_items(inputs.new_items)
    if model.config.popularity_correction:
        if inputs.item_counts is None:
            raise ValueError("popularity_correction needs the training counts of the items (Input.ITEM_COUNTS)")
        model.set_item_counts(inputs.item_counts)
    return model


def _shape(config: GenerativeConfig, rebuild: Rebuild) -> GenerativeRetriever:
    codes = torch.zeros(config.num_items + 1, len(config.codebook_sizes), dtype=torch.long)  # the state dict's
    return GenerativeRetriever(config, codes)


FAMILY = ModelFamily(
    "generative", GenerativeConfig, GenerativeRetriever, _build, training="generative",
    reads=lambda config: frozenset(
        {Input.SEMANTIC_IDS, Input.NEW_ITEMS, *([Input.ITEM_COUNTS] if config.popularity_correction else [])}
    ),
    shape=_shape,
    filled={"num_items": 1, "codebook_sizes": (1,)},
)  # fmt: skip
