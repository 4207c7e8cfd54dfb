"""One sequential retriever for several domains, plus a LoRA adapter per domain (Alibaba's MLoRA).

The base (a SASRec trained on every domain's users) is frozen; each domain gets low-rank adapters on the linear
layers of the transformer blocks (`recsys.modules.lora`) and, with `embedding_rank` > 0, a low-rank delta of its
own items' embeddings (`DomainItemLoRA`), trained on that domain's users only. A history is
scored with the adapter of its domain, over that domain's items only: the domain of its most recent item
(histories stay within a domain), or the one a request names (`score_in`). New adapters are zero, so before
training the model ranks like its base. In a pipeline: `model.name: domain_adapters` with `model.upstream.base`
(a trained SASRec model directory on the same multi-domain data); the domains are the data's.

Dimension letters: B histories, L length, V+1 items (0 = padding).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import NonNegativeInt, PositiveFloat, PositiveInt

from recsys.data.times import HistoryTimes
from recsys.errors import ConfigError
from recsys.models.family import (
    Input,
    Model,
    ModelFamily,
    ModelInputs,
    Rebuild,
    UpstreamRole,
    check_items,
    required,
)
from recsys.models.sasrec import SASRec
from recsys.modules.lora import DomainItemLoRA, LoRAConfig, add_lora, lora_layers, route
from recsys.runtime.validation import Fraction

# the linear layers of every SASRec block that get adapters: attention in/out and both feed-forward layers
BLOCK_LINEARS = ("attn.qkv", "attn.out", "ffn.0", "ffn.2")


@dataclass(frozen=True)
class DomainAdapterConfig:
    # the data's domain names, in `SequenceData.domains` order (filled from the data when the model is built)
    domains: tuple[str, ...] = ()
    rank: PositiveInt = 8
    alpha: PositiveFloat = 16.0
    dropout: Fraction = 0.0
    # rank of each domain's delta of its items' embeddings (input and output side: SASRec ties them); 0 = none.
    # Costs (domain items x rank) parameters, so it is the larger part of an adapter at rank >= 2
    embedding_rank: NonNegativeInt = 0
    # filled by `DomainAdaptedRetriever` from its base (saved with the model, so a loaded one rebuilds it)
    num_items: int = 0
    base: dict[str, Any] = field(default_factory=dict)  # {"name", "config"} of the frozen base


class DomainAdaptedRetriever(Model[DomainAdapterConfig]):
    """A frozen multi-domain SASRec + one LoRA adapter per domain on its block linears.

    Args:
        config: domains and adapter size.
        base: the retriever trained on all domains (frozen here).
        item_domain: (V+1,) every item's domain index (`SequenceData.item_domains()`), -1 for padding.
    """

    def __init__(self, config: DomainAdapterConfig, base: SASRec, item_domain: torch.Tensor) -> None:
        spec = {"name": "sasrec", "config": dataclasses.asdict(base.config)}
        super().__init__(dataclasses.replace(config, num_items=base.config.num_items, base=spec))
        self.base = base
        lora = LoRAConfig(domains=config.domains, rank=config.rank, alpha=config.alpha, dropout=config.dropout)
        add_lora(base, [f"blocks.{i}.{name}" for i in range(len(base.blocks)) for name in BLOCK_LINEARS], lora)
        self.items = DomainItemLoRA(item_domain, base.config.dim, config.domains, config.embedding_rank, config.alpha)

    @property
    def max_history(self) -> int:
        return self.base.max_history

    @property
    def domains(self) -> tuple[str, ...]:
        return self.config.domains

    @property
    def item_domain(self) -> torch.Tensor:
        """(V+1,) every item's domain index, -1 for the padding (filled from the data before training)."""
        return self.items.item_domain

    def check_domain_training(self, full_softmax: bool, weight_decay: float) -> None:
        """Training one domain must leave the others' parameters alone: item adapters share one table of item rows
        across domains, so they need the full softmax (a sampled one reads other domains' rows) and no weight decay
        (which moves every row); ConfigError otherwise (`recsys.training.capabilities.TrainsPerDomain`)."""
        rank = self.config.embedding_rank
        if rank and (not full_softmax or weight_decay):
            raise ConfigError(
                f"item adapters (model.params.embedding_rank={rank}) share one table of item rows across "
                "domains: training a domain must leave the others' rows alone, which needs model.training.loss: "
                "full_softmax and train.optimization.weight_decay: 0. Fix: set those, or embedding_rank: 0"
            )

    def adapter_parameters(self, domain: str) -> int:
        """Parameters of one domain's adapter (block layers and item embeddings)."""
        blocks = sum(p.numel() for layer in lora_layers(self) for p in layer.adapter(domain).parameters())
        return blocks + (self.items.adapter_parameters(domain) if self.config.embedding_rank else 0)

    def base_parameters(self) -> int:
        """Parameters of the shared base (embeddings included)."""
        return sum(p.numel() for p in self.base.parameters()) - sum(
            p.numel() for layer in lora_layers(self) for p in layer.adapters.parameters()
        )

    def history_domains(self, histories: torch.Tensor) -> torch.Tensor:
        """(B, L) histories -> (B,) the domain index of each row: its last item's (-1 = empty row, base alone).

        Left-padded rows end with the most recent item; packed training rows hold the users of one domain.
        """
        return self.item_domain[_last_item(histories.to(self.base.pos_emb.weight.device))]

    def forward(
        self, item_ids: torch.Tensor, segments: torch.Tensor | None = None, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """As `SASRec.forward`, every row through the adapter of its items' domain."""
        with route(self, self.history_domains(item_ids)):
            return self.base(item_ids, segments, positions, self.item_embeddings())

    def item_embeddings(self) -> torch.Tensor:
        """(V+1, D) the base's item vectors, each with its domain's delta."""
        delta = self.items.delta()
        table = self.base.item_embeddings()
        return table if delta is None else table + delta

    def score(
        self, histories: torch.Tensor, users: torch.Tensor | None = None, times: HistoryTimes | None = None
    ) -> torch.Tensor:
        """(B, L) left-padded histories -> (B, V+1) scores, each row with its history's domain adapter."""
        return self.score_in(histories, torch.full((histories.shape[0],), -1))

    def score_in(self, histories: torch.Tensor, domains: torch.Tensor) -> torch.Tensor:
        """(B, L) histories scored with the adapters of `domains` (B,) (e.g. the request's domain; -1 = the history's
        own); items of other domains get -inf (an empty history has no domain: the base alone ranks every item)."""
        domains = domains.to(self.base.pos_emb.weight.device)
        domains = torch.where(domains >= 0, domains, self.history_domains(histories))
        items = self.item_embeddings()
        with route(self, domains):
            scores = self.base(histories, items=items)[:, -1] @ items.T
        elsewhere = (self.item_domain[None, :] != domains[:, None]) & (domains[:, None] >= 0)
        return scores.masked_fill(elsewhere, float("-inf"))


def _last_item(rows: torch.Tensor) -> torch.Tensor:
    """(B, L) -> (B,) the last non-padding item of each row (left-padded: the last column; packed: the last
    non-zero one), 0 for an empty row."""
    last = (rows != 0).long().cumsum(dim=1).argmax(dim=1)  # first column reaching the row's count
    return rows.gather(1, last[:, None]).squeeze(1)


def _build(fields: dict[str, Any], inputs: ModelInputs) -> DomainAdaptedRetriever:
    base = required(inputs.base, f"model 'domain_adapters' adapts a SASRec of every domain. Fix: set {BASE.key}")
    if not isinstance(base.model, SASRec):  # its adapters wrap SASRec's block layers by name
        raise ConfigError(f"model 'domain_adapters' adapts a SASRec; {BASE.key} holds a {base.family} model")
    check_items(base, fields["num_items"], BASE.key)
    item_domains = required(inputs.item_domains, "model 'domain_adapters' needs the items' domains (a domain column)")
    asked = tuple(fields.get("domains") or inputs.domains)
    if asked != inputs.domains:
        raise ConfigError(
            f"model.params.domains={list(asked)} but the data's domains are {list(inputs.domains)}. Fix: leave "
            "domains out (the data's are used)"
        )
    params = {k: v for k, v in fields.items() if k != "num_items"}  # the model fills in its base's size
    return DomainAdaptedRetriever(FAMILY.validate({**params, "domains": asked}), base.model, item_domains)


def _shape(config: DomainAdapterConfig, rebuild: Rebuild) -> DomainAdaptedRetriever:
    base = rebuild(config.base)
    assert isinstance(base, SASRec)
    return DomainAdaptedRetriever(config, base, torch.zeros(config.num_items + 1, dtype=torch.long))


BASE = UpstreamRole("base", Input.BASE, "the SASRec of every domain it adapts")
FAMILY = ModelFamily(
    "domain_adapters", DomainAdapterConfig, DomainAdaptedRetriever, _build, training="next_item",
    reads=lambda config: frozenset({Input.DOMAINS}), upstream=(BASE,), shape=_shape,
    filled={"num_items": 0, "base": {}},
)  # fmt: skip
