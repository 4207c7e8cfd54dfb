"""Content-first item vectors: what an item's text says, plus what its interactions add, so that new items have one.

    vector(i) = f(content_i) + keep_i * residual_i

f is a small MLP over the item's content embedding (frozen, from `recsys.semantic_ids.content`), shared by every
item; residual_i is a free ID embedding, zero at the start. In training the residual of an item seen c times is kept
with probability p = c / (c + half_count) and dropped otherwise, each step afresh (DropoutNet, Volkovs et al.,
NeurIPS 2017, drops a whole preference input so the content path learns to stand alone; here the rate follows the
evidence an item has). A rare item so mostly trains through f, a frequent one mostly through its residual, and at
scoring time the residual counts with its expectation p: shrunk towards the content for rare items, nearly whole for
frequent ones, and exactly zero for an item never trained (a cold item, one added at run time), whose vector is its
content's alone.

Dimension letters: V+1 items (0 = padding), C content dim, D model dim, H hidden.
"""

from __future__ import annotations

import torch
from torch import nn

from recsys.data.schema import PADDING_IDX
from recsys.modules.inference_cache import InferenceCache


class ContentFirstItems(nn.Module):
    """(V+1, D) item vectors from content embeddings and frequency-scaled ID residuals.

    Args:
        content: (V+1, C) the items' content embeddings, row 0 (the padding) zero; kept in the state dict, so a saved
            model scores its catalogue without the embeddings beside it.
        counts: (V+1,) how often each item occurs in the training sequences (0: never trained, no residual).
        dim: D.
        half_count: the training count at which an item's residual is kept half the time.
        residual: False: no ID residual, the vectors are the content's alone.
        hidden: H, the MLP's hidden width (default 4 D).

    Example:
        >>> items = ContentFirstItems(torch.randn(4, 3), torch.tensor([0, 5, 0, 100]), dim=2, half_count=5.0)
        >>> items.keep_probability.tolist()  # the padding and the never-trained item 2 have none
        [0.0, 0.5, 0.0, 0.9523809552192688]
        >>> items.eval()().shape, items.of_content(torch.randn(7, 3)).shape  # the catalogue; 7 items from text alone
        (torch.Size([4, 2]), torch.Size([7, 2]))
    """

    content: torch.Tensor
    counts: torch.Tensor

    def __init__(
        self,
        content: torch.Tensor,
        counts: torch.Tensor,
        dim: int,
        half_count: float,
        residual: bool = True,
        hidden: int | None = None,
    ) -> None:
        super().__init__()
        if content.ndim != 2 or counts.shape != content.shape[:1]:
            raise ValueError(f"content (V+1, C) and counts (V+1,) must agree: got {tuple(content.shape)} and "
                             f"{tuple(counts.shape)}")  # fmt: skip
        if half_count < 0:
            raise ValueError(f"half_count should be >= 0, got {half_count}")
        self.half_count = half_count
        self.register_buffer("content", content.float().clone())
        self.register_buffer("counts", counts.float().clone())
        width = hidden or 4 * dim
        self.encode = nn.Sequential(
            nn.LayerNorm(content.shape[1]), nn.Linear(content.shape[1], width), nn.GELU(), nn.Linear(width, dim)
        )
        self.residual = nn.Embedding(len(content), dim, padding_idx=PADDING_IDX) if residual else None
        self._table = InferenceCache()  # `forward`'s table, in inference
        for layer in self.encode:
            if isinstance(layer, nn.Linear):  # the scale of the transformers' embeddings (std 0.02)
                nn.init.normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)
        if self.residual is not None:
            nn.init.zeros_(self.residual.weight)  # the content speaks first; interactions add what it misses

    @classmethod
    def of_size(
        cls,
        num_items: int,
        content_dim: int,
        dim: int,
        half_count: float,
        content: torch.Tensor | None = None,
        counts: torch.Tensor | None = None,
        residual: bool = True,
    ) -> ContentFirstItems:
        """A model's items: of `content` and `counts` when given, else of zeros that a saved state dict then fills."""
        return cls(
            content if content is not None else torch.zeros(num_items + 1, content_dim),
            counts if counts is not None else torch.zeros(num_items + 1),
            dim,
            half_count,
            residual,
        )

    @property
    def keep_probability(self) -> torch.Tensor:
        """(V+1,) the chance each item's residual is kept in training, and the weight it gets when scoring."""
        return keep_probability(self.counts, self.half_count)

    def of_content(self, content: torch.Tensor) -> torch.Tensor:
        """(N, C) content embeddings of any items, known or not -> (N, D) their vectors without a residual."""
        return self.encode(content.to(self.content.device, self.content.dtype))

    def forward(self) -> torch.Tensor:
        """(V+1, D) every item's vector; the padding row zero. In training mode each residual is kept at random;
        in inference the table is projected once per state of the weights (`InferenceCache`), not once per call."""
        if self.training:
            return self._vectors()
        return self._table.get("vectors", self._vectors, reads=[*self.parameters(), *self.buffers()])

    def _vectors(self) -> torch.Tensor:
        vectors = self.of_content(self.content)
        if self.residual is not None:
            keep = self.keep_probability
            if self.training:
                keep = torch.bernoulli(keep)
            vectors = vectors + keep[:, None] * self.residual.weight
        return vectors.index_fill(0, torch.tensor([PADDING_IDX], device=vectors.device), 0.0)

    def extra_repr(self) -> str:
        return f"half_count={self.half_count}, residual={self.residual is not None}"


def keep_probability(counts: torch.Tensor, half_count: float) -> torch.Tensor:
    """count / (count + half_count): the chance an item's ID part is kept in training (and its weight when scoring);
    0 for an item never trained, whatever `half_count` (0 included)."""
    return torch.where(counts > 0, counts / (counts + half_count).clamp_min(1e-12), torch.zeros_like(counts))
