"""`enrich_items`: items with text -> LLM-written records, item_metadata.parquet (`pipelines.enrich.enrich_step`); for a
config with an `enrich` section. Its consumers read the records' columns (`recsys.enrich.columns`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.config import ExperimentConfig
from pipelines.steps.base import ExperimentPaths, Step, as_json
from pipelines.steps.outputs import ItemMetadata, PipelineOutputs
from recsys.artifacts.model_dir import file_sha256
from recsys.data.schema import METADATA_FILE
from recsys.errors import ConfigError

# how an enrichment runs, not what it writes: changing one leaves finished records current
ENRICH_RUNTIME = {
    "batch_size",
    "device",
    "threads",
    "concurrency",
    "requests_per_s",
    "timeout_s",
    "max_retries",
    "max_failures_in_a_row",
}


class EnrichItemsStep(Step[ItemMetadata]):
    name = "enrich_items"
    field = "metadata"
    output = ItemMetadata

    def inputs(self, config: ExperimentConfig, done: PipelineOutputs) -> dict[str, Any] | None:
        if config.enrich is None:
            return None
        section = config.model_dump(mode="json", include={"enrich"}, exclude={"enrich": ENRICH_RUNTIME})["enrich"]
        records = config.enrich.records
        if records is not None and not Path(records).is_file():
            raise ConfigError(f"enrich.records {records}: no such file. Fix: name an item_metadata.parquet")
        seed = None if records is None else file_sha256(Path(records))
        return {"enrich": section, "records_sha256": seed, "data": as_json(done.data)}

    def run(self, config: ExperimentConfig, paths: ExperimentPaths, done: PipelineOutputs) -> ItemMetadata:
        from pipelines.enrich import enrich_step  # the LLM backends load for this step only

        assert config.enrich is not None and done.data is not None
        enrich_step(config.enrich, done.data.data_dir, paths.metadata_dir, paths.enrich_cache_dir)
        path = paths.metadata_dir / METADATA_FILE
        return ItemMetadata(path, file_sha256(path))

    def produces(self, outputs: ItemMetadata) -> list[Path]:
        return [outputs.path]
