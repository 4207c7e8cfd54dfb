"""The search protocol (docs/search.md) on the outputs of an experiment whose model reads text queries
(`recsys.inference.QueryScorer`): its content directory read into what `recsys.evaluation.search` needs, and the
model's own settings evaluated.

Such an experiment's content directory (`WORK/content/NAME`, its `embed_content` step) holds

    content_embeddings.npy    (V, C) the items' text embeddings: dense search, the neighbour-mix level's neighbours
    content_embeddings.json   the encoder settings (`ContentConfig`) queries must be embedded with
    training_queries.npz      the training queries, which the test queries must differ from

`search_inputs` reads it into the test split's queries per level and the query embedder (what every search system
shares); `evaluate_query_scorer` ranks the model alone in its settings (the pipeline's `evaluate` step);
`benchmarks.search` puts BM25, dense search and SASRec beside it on the same inputs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipelines.content import CONTENT_EMBEDDINGS_FILE, CONTENT_META_FILE
from recsys.data.prepared import EvalSplit, SequenceData
from recsys.data.splits import TEST
from recsys.errors import ConfigError
from recsys.evaluation import EvalConfig
from recsys.evaluation.queries import Level, QueryMaker, catalogue_titles, most_similar
from recsys.evaluation.search import QuerySearch, SearchEvaluation, evaluate_search, level_queries
from recsys.inference import QueryScorer
from recsys.retrieval.text import QueryEmbedder
from recsys.runtime.validation import config_from
from recsys.semantic_ids.content import ContentConfig, read_content_embeddings
from recsys.training.recipes import QUERIES_FILE, QueryBank

logger = logging.getLogger(__name__)

SEARCH_SEED = 0  # the evaluate step's query seed (the search benchmark's `seed` too)


@dataclass(frozen=True)
class SearchInputs:
    """What the search systems of one evaluation share (U test users, V items, C content dimensions)."""

    encoder: ContentConfig  # what the items' content was embedded with: queries are embedded so
    content: np.ndarray  # (V, C) the items' content embeddings
    split: EvalSplit  # the test split
    queries: dict[Level, list[str]]  # {level: (U,) each test user's query, "" for none}
    embed: QueryEmbedder  # query texts -> (B, C), by `encoder`


def search_inputs(
    content_dir: Path, model: QueryScorer, data: SequenceData, seed: int, cache_dir: Path | None = None
) -> SearchInputs:
    """The test split of `data` and its queries per level (protocol seed `seed`), from the content directory of
    `model`'s experiment; queries are embedded with its encoder, through the embeddings cache `cache_dir` (None:
    none)."""
    encoder = content_config(content_dir, model)
    content = read_content_embeddings(content_dir / CONTENT_EMBEDDINGS_FILE, data.num_items)
    maker = QueryMaker(catalogue_titles(data.items), most_similar(content), seed)
    split = data.eval_split(TEST)
    queries = level_queries(maker, split, QueryBank.load_texts(content_dir / QUERIES_FILE))
    logger.info("search protocol: %d test users' queries (seed %d), embedded by %s", len(split.targets), seed,
                encoder.model)  # fmt: skip
    embed = QueryEmbedder(encoder, cache_dir)
    embed([text for texts in queries.values() for text in texts if text])  # all at once: one write of the cache
    return SearchInputs(encoder, content, split, queries, embed)


def query_search(model: QueryScorer, inputs: SearchInputs) -> QuerySearch:
    """`model` as a search system, its queries embedded by `inputs`' encoder (the model in eval mode)."""
    return QuerySearch(model, inputs.embed)


def evaluate_query_scorer(
    name: str, model: QueryScorer, data: SequenceData, content_dir: Path, config: EvalConfig, cache_dir: Path | None
) -> SearchEvaluation:
    """`model` (a system called `name`, in eval mode) alone on the search protocol of `data`'s test split (seed
    `SEARCH_SEED`): for each level history+query and no-history, and history-only
    (`recsys.evaluation.search.evaluate_search`)."""
    inputs = search_inputs(content_dir, model, data, SEARCH_SEED, cache_dir)
    return evaluate_search({name: query_search(model, inputs)}, inputs.split, inputs.queries, config)


def content_config(content_dir: Path, model: QueryScorer) -> ContentConfig:
    """The `ContentConfig` the items' content was embedded with (content_embeddings.json): queries are embedded so."""
    meta_path = content_dir / CONTENT_META_FILE
    if not meta_path.is_file():
        raise ConfigError(
            f"content_dir {content_dir} has no {CONTENT_META_FILE}. Fix: the content directory of the model's "
            "experiment (WORK/content/<config name>), written by its embed_content step"
        )
    encoder = json.loads(meta_path.read_text())["encoder"]
    fields = {f.name for f in dataclasses.fields(ContentConfig)}
    config = config_from(ContentConfig, {key: value for key, value in encoder.items() if key in fields}, "encoder.")
    if config.model != model.query_encoder:
        raise ConfigError(
            f"content_dir {content_dir} was embedded with {config.model!r}, the model reads queries of "
            f"{model.query_encoder!r}. Fix: the content directory of the model's own experiment"
        )
    return dataclasses.replace(config, progress=False)
