"""A drop-in for torchrec's `EmbeddingBagCollection` whose lookups run through `recsys.ops.embedding_bag`.

Same inputs and outputs as torchrec's module: built from a list of `EmbeddingBagConfig`, called with a
`KeyedJaggedTensor`, returns a `KeyedTensor` (fp32, keys = feature names in config order). The difference
is the backend: the tables of one (dim, dtype, pooling) group live in one flat buffer and are looked up
in one launch (TBE style) by the dispatcher's TORCH or TRITON kernel (`kernel=None`: TRITON on CUDA, TORCH
elsewhere; the choice is logged once). It avoids torchrec's fbgemm-backed KJT helpers, so it also runs on a
GPU where only the CPU build of fbgemm is installed.

Dimension letters: B batch, F features of a group, D dim, N ids.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor
from torchrec.modules.embedding_configs import DataType, PoolingType

from recsys.ops.embedding_bag import Kernel, embedding_bag
from recsys.ops.reference.embedding_bag import Pooling

_DTYPES = {DataType.FP32: torch.float32, DataType.FP16: torch.float16, DataType.BF16: torch.bfloat16}
_POOLING: dict[PoolingType, Pooling] = {PoolingType.SUM: "sum", PoolingType.MEAN: "mean"}


@dataclass(frozen=True)
class _Group:
    """Tables looked up in one launch: same dim, dtype and pooling; one feature per table."""

    tables: tuple[EmbeddingBagConfig, ...]
    dim: int
    dtype: torch.dtype
    pooling: Pooling

    @property
    def features(self) -> list[str]:
        return [table.feature_names[0] for table in self.tables]


class FusedEmbeddingBagCollection(nn.Module):
    """torchrec-compatible embedding bags over the project's kernels.

    Args:
        tables: torchrec `EmbeddingBagConfig`s (each with exactly one feature name; SUM or MEAN pooling;
            FP32, FP16 or BF16 data type). Initialised as torchrec does: `init_fn` when given, else uniform
            in [weight_init_min, weight_init_max] (default ±sqrt(1 / num_embeddings)).
        is_weighted: use the KJT's weights as per-sample weights.
        device: where the tables live.
        kernel: `Kernel.TORCH`, `Kernel.TRITON`, `Kernel.FBGEMM` (with sparse_grad=False), or None to choose by
            the device.
        sparse_grad: table gradients as sparse COO tensors (for SGD / Adagrad / SparseAdam) instead of dense.
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        is_weighted: bool = False,
        device: torch.device | str | None = None,
        kernel: Kernel | None = None,
        sparse_grad: bool = False,
    ) -> None:
        super().__init__()
        if not tables:
            raise ValueError("FusedEmbeddingBagCollection needs at least one EmbeddingBagConfig")
        for table in tables:
            _check_table(table)
        self.tables = list(tables)
        self.is_weighted, self.kernel, self.sparse_grad = is_weighted, kernel, sparse_grad
        self.groups = _group(self.tables)
        self.weights = nn.ParameterList(
            nn.Parameter(torch.empty(sum(t.num_embeddings for t in g.tables), g.dim, dtype=g.dtype, device=device))
            for g in self.groups
        )
        for g, group in enumerate(self.groups):
            row_offsets = torch.tensor([0, *accumulate(t.num_embeddings for t in group.tables)])
            self.register_buffer(f"row_offsets_{g}", row_offsets.to(device), persistent=False)
        self.reset_parameters()
        self.feature_names = [t.feature_names[0] for t in self.tables]
        self.dims = [t.embedding_dim for t in self.tables]

    def reset_parameters(self) -> None:
        with torch.no_grad():
            for table in self.tables:
                weight = self.table_weight(table.name)
                if table.init_fn is not None:
                    table.init_fn(weight)
                    continue
                bound = math.sqrt(1.0 / table.num_embeddings)
                low = table.weight_init_min if table.weight_init_min is not None else -bound
                high = table.weight_init_max if table.weight_init_max is not None else bound
                weight.uniform_(low, high)

    def table_weight(self, name: str) -> torch.Tensor:
        """(num_embeddings, D) view of table `name` inside its group's flat buffer."""
        for g, group in enumerate(self.groups):
            start = 0
            for table in group.tables:
                if table.name == name:
                    return self.weights[g][start : start + table.num_embeddings]
                start += table.num_embeddings
        raise KeyError(f"no table named {name!r}; tables: {[t.name for t in self.tables]}")

    @classmethod
    def from_torchrec(
        cls, ebc: EmbeddingBagCollection, kernel: Kernel | None = None, sparse_grad: bool = False
    ) -> FusedEmbeddingBagCollection:
        """The same tables and weights as a torchrec `EmbeddingBagCollection` (copied)."""
        tables = ebc.embedding_bag_configs()
        device = next(iter(ebc.parameters())).device
        fused = cls(tables, is_weighted=ebc.is_weighted(), device=device, kernel=kernel, sparse_grad=sparse_grad)
        with torch.no_grad():
            for table in tables:
                fused.table_weight(table.name).copy_(ebc.embedding_bags[table.name].weight)
        return fused

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """KJT holding (at least) every table's feature -> KeyedTensor (B, sum of dims) fp32, config order."""
        missing = set(self.feature_names) - set(features.keys())
        if missing:
            raise KeyError(f"the KeyedJaggedTensor lacks features {sorted(missing)}; it has {features.keys()}")
        pooled: dict[str, torch.Tensor] = {}
        for g, group in enumerate(self.groups):
            values, lengths, weights = _feature_slices(features, group.features, self.is_weighted)
            offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
            torch.cumsum(lengths, dim=0, out=offsets[1:])
            out = embedding_bag(
                self.weights[g],
                values.long(),
                offsets,
                getattr(self, f"row_offsets_{g}"),
                pooling=group.pooling,
                per_sample_weights=weights,
                output_dtype=torch.float32,
                kernel=self.kernel,
                sparse_grad=self.sparse_grad,
            )  # (B, F*D)
            for f, name in enumerate(group.features):
                pooled[name] = out[:, f * group.dim : (f + 1) * group.dim]
        values = (
            next(iter(pooled.values())) if len(pooled) == 1 else torch.cat([pooled[n] for n in self.feature_names], 1)
        )
        return KeyedTensor(keys=self.feature_names, length_per_key=self.dims, values=values)


def _check_table(table: EmbeddingBagConfig) -> None:
    if len(table.feature_names) != 1:
        raise ValueError(
            f"table {table.name!r} serves features {table.feature_names}: FusedEmbeddingBagCollection supports one "
            "feature per table. Fix: give each feature its own table, or use torchrec's EmbeddingBagCollection"
        )
    if table.pooling not in _POOLING:
        raise ValueError(f"table {table.name!r}: pooling {table.pooling} is not supported. Fix: use SUM or MEAN")
    if table.data_type not in _DTYPES:
        raise ValueError(f"table {table.name!r}: data type {table.data_type} is not supported. Fix: FP32, FP16 or BF16")


def _group(tables: Sequence[EmbeddingBagConfig]) -> list[_Group]:
    """Tables of the same (dim, dtype, pooling), in first-seen order; each group is one kernel launch."""
    groups: dict[tuple[int, torch.dtype, Pooling], list[EmbeddingBagConfig]] = {}
    for table in tables:
        key = (table.embedding_dim, _DTYPES[table.data_type], _POOLING[table.pooling])
        groups.setdefault(key, []).append(table)
    return [_Group(tuple(ts), dim, dtype, pooling) for (dim, dtype, pooling), ts in groups.items()]


def _feature_slices(
    kjt: KeyedJaggedTensor, names: list[str], weighted: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Values, lengths (F*B,) and weights of `names`, feature-major, without fbgemm ops.

    When the KJT holds exactly these features in this order its buffers are used as they are; otherwise
    the features are cut out with plain tensor slicing (one host sync for the per-key lengths).
    """
    keys, lengths = kjt.keys(), kjt.lengths()
    weights = kjt.weights() if weighted else None
    if keys == names:
        return kjt.values(), lengths, weights
    batch = kjt.stride()
    per_key = lengths.view(len(keys), batch).sum(dim=1).tolist()
    starts = [0, *accumulate(per_key[:-1])]
    position = {key: i for i, key in enumerate(keys)}
    spans = [(starts[position[n]], per_key[position[n]]) for n in names]
    values = torch.cat([kjt.values()[s : s + n] for s, n in spans])
    picked_lengths = torch.cat([lengths[position[n] * batch : (position[n] + 1) * batch] for n in names])
    picked_weights = None if weights is None else torch.cat([weights[s : s + n] for s, n in spans])
    return values, picked_lengths, picked_weights
