"""What the steps hand on: each step's outputs (a frozen dataclass, recorded as JSON in the pipeline's state file, with
a `summary()` for MLflow and the CLI's table), and `PipelineOutputs`, those of every step run so far."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipelines.evaluate import EvaluateOutputs
from pipelines.registry import GateDecision
from pipelines.train import CatalogFeatures, TrainOutputs


@dataclass(frozen=True)
class PreparedData:
    data_dir: Path
    sha256: str  # of its files: what the steps downstream of the data depend on

    def summary(self) -> dict[str, object]:
        return {"data_dir": self.data_dir}


@dataclass(frozen=True)
class ItemMetadata:
    path: Path  # item_metadata.parquet
    sha256: str  # of it: the consumers downstream depend on its records

    def summary(self) -> dict[str, object]:
        return {"item_metadata": self.path}


@dataclass(frozen=True)
class ContentEmbeddings:
    path: Path  # content_embeddings.npy
    queries: Path | None = None  # training_queries.npz, for a model that reads queries
    encoder: str | None = None  # the encoder (`ContentConfig.model`) that made them

    def summary(self) -> dict[str, object]:
        return {"content_embeddings": self.path, "training_queries": self.queries}


@dataclass(frozen=True)
class SemanticIds:
    path: Path  # semantic_ids.parquet

    def summary(self) -> dict[str, object]:
        return {"semantic_ids": self.path}


@dataclass(frozen=True)
class IndexOutputs:
    index_dir: Path
    recall: float  # recall@k of the index against exact search, measured as it was built
    k: int

    def summary(self) -> dict[str, object]:
        return {"index_dir": self.index_dir, "recall@k": self.recall, "k": self.k}


@dataclass(frozen=True)
class Registration:
    bundle_dir: Path
    decision: GateDecision

    def summary(self) -> dict[str, object]:
        d = self.decision
        return {"bundle_dir": self.bundle_dir, "version": d.version, "promoted": d.promoted, "reason": d.reason}


Output = (
    PreparedData
    | ItemMetadata
    | ContentEmbeddings
    | SemanticIds
    | TrainOutputs
    | IndexOutputs
    | EvaluateOutputs
    | Registration
)


@dataclass
class PipelineOutputs:
    """What the steps have produced so far (None: not run yet, or not applicable)."""

    data: PreparedData | None = None
    metadata: ItemMetadata | None = None
    content: ContentEmbeddings | None = None
    semantic_ids: SemanticIds | None = None
    model: TrainOutputs | None = None
    index: IndexOutputs | None = None
    evaluation: EvaluateOutputs | None = None
    registration: Registration | None = None

    def features(self) -> CatalogFeatures:
        return CatalogFeatures(
            semantic_ids=None if self.semantic_ids is None else self.semantic_ids.path,
            content_embeddings=None if self.content is None else self.content.path,
            content_encoder=None if self.content is None else self.content.encoder,
            training_queries=None if self.content is None else self.content.queries,
            item_metadata=None if self.metadata is None else self.metadata.path,
        )
