"""A loaded model bundle answering recommendation, search and similar-item queries (no HTTP here).

What the model can do is read once when the bundle loads (`serving.ranking.Capabilities`), and so is how it ranks
(`serving.ranking.ranking_for`); every exact ranking is the library's (`recsys.inference`), the offline evaluation's.

A model that reads text queries (`recsys.inference.QueryScorer`) takes one beside the history, or alone (search): the
recommender then loads the model's content encoder and embeds each batch's queries in one call. A model whose item
vectors come from content (`recsys.inference.ContentItemScorer`) takes new items at run time (`with_items`): their
text is embedded by that encoder, their vectors join the item table every request is scored over (indices V+1...), and
an exact index of them joins the bundle's for similar items.

Dimension letters: V items (item_idx 1..V, 0 = padding), D vector dim, C encoder dim, k results.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from recsys.artifacts.added_items import NewItem, merged
from recsys.artifacts.bundle import Bundle
from recsys.artifacts.catalogue import read_catalogue
from recsys.artifacts.model_dir import MODEL_FILE, trained_text_fields
from recsys.data.jagged import Jagged
from recsys.data.schema import TITLE
from recsys.errors import RecsysError
from recsys.inference import rank_scores
from recsys.models.registry import load_model
from recsys.retrieval import ExactTopK, TopK
from recsys.retrieval.union import UnionTopK
from serving.history import Event
from serving.ranking import Capabilities, HistoryRanking, Ranked, RankingRequests, RequestTimes, ranking_for

if TYPE_CHECKING:
    from recsys.semantic_ids.content import ContentConfig, TextEncoder

logger = logging.getLogger(__name__)
ANN_ABOVE_ITEMS = 100_000  # recommendations rank every item up to this catalogue size, through the index above it


class CannotPlaceItems(ValueError):
    """The served model cannot place the items: its item vectors do not come from content, or it holds its most."""


class InTrainedCatalogue(ValueError):
    """Items added at run time whose ids the trained catalogue holds already."""

    def __init__(self, item_ids: list[str]) -> None:
        self.item_ids = item_ids
        super().__init__(f"{len(item_ids)} of the items are in the trained catalogue already (e.g. {item_ids[0]!r}): "
                         "add only new items")  # fmt: skip


@dataclass(frozen=True)
class RecommendationQuery:
    history: list[int]  # item_idx, oldest first, at most `Recommender.max_history`
    k: int
    exclude_seen: bool
    timestamps: list[int] | None = None  # unix seconds of the history items (time-aware models); None = unknown
    request_time: int = 0  # unix seconds of the request (time-aware models); 0 = unknown (no gaps are read)
    domain: int = -1  # multi-domain models: the requested domain's index (its adapter and items); -1 = the history's
    text: str | None = None  # a text query (models that read them); with an empty history: search alone
    user: int = 0  # user_idx of a known user (models trained with user tokens read it); 0 = unknown


@dataclass(frozen=True)
class Recommendation:
    item_id: str
    title: str
    score: float


class Recommender:
    """The bundle's model, catalogue and users' histories, plus its FAISS index for similar items."""

    def __init__(self, bundle: Bundle) -> None:
        self.name, model = load_model(bundle.model_dir / MODEL_FILE)
        self.model = model.eval()
        self.catalogue, self.histories = read_catalogue(bundle.catalogue_file)
        if self.catalogue.num_items != model.config.num_items:
            raise RecsysError(
                f"{bundle.path}: its catalogue has {self.catalogue.num_items} items, its model "
                f"{model.config.num_items}. Fix: assemble the bundle again (the pipeline's register step)"
            )
        self.capabilities = Capabilities.of(model)
        self._bundle_version = bundle.version
        self._adapters: dict[str, str] = {}  # domain -> digest of the adapter file swapped in (admin route)
        self.max_history = model.max_history  # the most recent items the model reads
        self._reads_timestamps = model.reads_timestamps
        domains = self.capabilities.domains
        # a model of several domains: a request may name one (its adapter, its items)
        self.domains: list[str] = [] if domains is None else list(domains.domains)
        self._catalogue_idx = {item_id: i + 1 for i, item_id in enumerate(self.catalogue.item_ids)}
        self._item_idx = self._catalogue_idx  # + the items added at run time
        self._item_ids = ["", *self.catalogue.item_ids]
        self._popular = torch.argsort(self.catalogue.item_counts[1:], descending=True, stable=True) + 1  # (V,)
        # a content-first model: its (V+1+N, D) item table, computed once (not per request), N items added at run time
        self._item_table: torch.Tensor | None = None
        self._added: tuple[NewItem, ...] = ()
        self._text_fields: tuple[str, ...] = ()
        self._item_encoder: list[TextEncoder] = []  # `load_item_encoder`, shared by the copies
        if self.capabilities.content is not None:
            with torch.no_grad():
                self._item_table = self.capabilities.content.item_embeddings().float()
            self._text_fields = trained_text_fields(bundle.model_dir)
        self._catalogue_similar = self._similar_items_index(bundle.index_dir)
        self._similar = self._catalogue_similar
        self._queries: tuple[ContentConfig, TextEncoder] | None = None
        if self.capabilities.queries is not None:  # the encoder that embedded its items embeds the queries
            from recsys.semantic_ids.content import ContentConfig, load_encoder

            encoding = ContentConfig(model=self.capabilities.queries.query_encoder, progress=False)
            self._queries = encoding, load_encoder(encoding)
            logger.info("text queries embedded by %s", encoding.model)
        # above ANN_ABOVE_ITEMS items a request's full ranking costs tens of ms (a 10^6 x 64 matmul per history):
        # the bundle's index then serves recommendations too, approximately (its build report has its recall)
        self._ranks_by_index = bundle.index_dir is not None and self.num_items > ANN_ABOVE_ITEMS and not self.domains
        if self._ranks_by_index:
            logger.info("recommendations come from the index (%s items > %s): approximate, as similar items",
                        f"{self.num_items:,}", f"{ANN_ABOVE_ITEMS:,}")  # fmt: skip
        self._ranking = self._history_ranking()
        self._warm_up()

    def _warm_up(self) -> None:
        """One model call before the first request: what the model makes once per weights (an item table, a
        content-neighbour table) is made while the bundle loads, not in a request's time."""
        started = time.perf_counter()
        self.recommend_batch([RecommendationQuery([int(self._popular[0])], 1, False)])
        logger.info("%s model warmed up in %.2f s", self.name, time.perf_counter() - started)

    def _history_ranking(self) -> HistoryRanking:
        return ranking_for(self.capabilities, self.model, self._item_table,
                           self._similar if self._ranks_by_index else None)  # fmt: skip

    @property
    def version(self) -> str:
        """The bundle's version, each adapter swapped in since, by domain, and the count of items added at run time:
        `7+beauty:1a2b3c4d`, `7+items:12`."""
        adapters = "".join(f"+{d}:{digest}" for d, digest in sorted(self._adapters.items()))
        return self._bundle_version + adapters + (f"+items:{len(self._added)}" if self._added else "")

    @property
    def num_items(self) -> int:
        """Items it ranks: the trained catalogue's and those added at run time."""
        return self.catalogue.num_items + len(self._added)

    @property
    def takes_new_items(self) -> bool:
        """Whether items never trained on can be added at run time (`with_items`): a content-first model."""
        return self._item_table is not None

    @property
    def added_items(self) -> tuple[NewItem, ...]:
        """The items added at run time, in index order (V+1, V+2, ...)."""
        return self._added

    def in_catalogue(self, item_ids: list[str]) -> list[str]:
        """Those of `item_ids` the trained catalogue holds (not added at run time)."""
        return [item_id for item_id in item_ids if item_id in self._catalogue_idx]

    @torch.no_grad()
    def with_items(
        self, items: list[NewItem], embeddings_dir: Path | None = None, max_items: int | None = None
    ) -> Recommender:
        """A copy that also ranks `items`, placed by their text alone, and finds them as similar items; an id added
        before is replaced. Their texts' encoder vectors are cached in `embeddings_dir` (none: not cached). This one
        is untouched, so requests in flight finish on it. Before anything is embedded: `CannotPlaceItems` for a model
        whose item vectors do not come from content or when it would place more than `max_items` items,
        `InTrainedCatalogue` for ids of its trained catalogue. OSError when the cache cannot be written."""
        if self._item_table is None:
            raise CannotPlaceItems(
                f"the served {self.name} model cannot place items it never trained on: its item vectors do not come "
                "from content. Fix: serve a model trained with model.params.content_first: true (docs/models.md)"
            )
        known = self.in_catalogue([item.item_id for item in items])
        if known:
            raise InTrainedCatalogue(known)
        total = len({*(item.item_id for item in self._added), *(item.item_id for item in items)})
        if max_items is not None and total > max_items:
            raise CannotPlaceItems(
                f"the served model would place {total} run-time items, more than RECSYS_MAX_ADDED_ITEMS "
                f"({max_items}). Fix: retrain the bundle with the items added so far"
            )
        catalogue = self.catalogue.num_items + 1
        previous = dict(zip((item.item_id for item in self._added), self._item_table[catalogue:], strict=True))
        vectors_of_items = self._content_vectors(items, embeddings_dir)
        placed = {item.item_id: vector for item, vector in zip(items, vectors_of_items, strict=True)}
        added, vector_of = merged(list(self._added), items), {**previous, **placed}
        vectors = torch.stack([vector_of[item.item_id] for item in added])
        ids = torch.arange(catalogue, catalogue + len(added))
        swapped = copy.copy(self)
        swapped._added = tuple(added)
        swapped._item_table = torch.cat([self._item_table[:catalogue], vectors])
        swapped._item_idx = {**self._catalogue_idx, **{item.item_id: catalogue + n for n, item in enumerate(added)}}
        swapped._item_ids = [*self._item_ids[:catalogue], *(item.item_id for item in added)]
        if self._catalogue_similar is not None:  # the added items scored as the bundle's index scores its own
            metric = self._catalogue_similar.metric
            swapped._similar = UnionTopK([self._catalogue_similar, ExactTopK(vectors, ids, metric)])
        swapped._ranking = swapped._history_ranking()
        return swapped

    def load_item_encoder(self) -> TextEncoder:
        """The encoder that embeds new items' texts, loaded once and shared by this recommender's copies. A server
        that takes run-time items loads it on its change thread once the bundle serves (`serving.state`): neither
        the time to ready nor the requests served beside it wait for it."""
        content = self.capabilities.content
        assert content is not None and content.content_encoder is not None, "a content-first model's"
        if not self._item_encoder:
            from recsys.semantic_ids.content import ContentConfig, load_encoder

            self._item_encoder.append(load_encoder(ContentConfig(model=content.content_encoder, progress=False)))
            logger.info("new items' texts embedded by %s (%s)", content.content_encoder, ", ".join(self._text_fields))
        return self._item_encoder[0]

    def _content_vectors(self, items: list[NewItem], embeddings_dir: Path | None) -> torch.Tensor:
        """(N, D) the vectors of new items: their text made as the catalogue's was, embedded by the model's encoder
        (the texts cached in `embeddings_dir` are not embedded again)."""
        from recsys.semantic_ids.content import ContentConfig, embed_texts, item_text

        content = self.capabilities.content
        assert content is not None and content.content_encoder is not None, "a content-first model's"
        texts = [item_text(item.item_id, {**item.fields, TITLE: item.title}, self._text_fields) for item in items]
        encoding = ContentConfig(model=content.content_encoder, progress=False)
        encoder = _OnFirstUse(encoding.cache_key, self.load_item_encoder)  # texts all cached: no encoder loaded
        encoded = embed_texts(texts, encoding, embeddings_dir, encoder=encoder)
        return content.vectors_of_content(torch.from_numpy(encoded)).float()

    @property
    def takes_queries(self) -> bool:
        """Whether the served model reads a text query (search, or search and history together)."""
        return self._queries is not None

    def item_idx(self, item_ids: list[str]) -> tuple[list[int], list[str]]:
        """(item_idx of the known ids, in order; the unknown ids)."""
        known = [self._item_idx[i] for i in item_ids if i in self._item_idx]
        return known, [i for i in item_ids if i not in self._item_idx]

    def with_adapter(self, domain: str, path: Path) -> Recommender:
        """A copy serving `domain` with the adapter file at `path` (written by `recsys.modules.lora.save_adapter`);
        this one is untouched, so requests in flight finish on it. ValueError saying what is wrong otherwise (the
        message names the file by its name only: callers may not learn the server's directories)."""
        from recsys.modules.lora import load_adapter

        self.domain_index(domain)
        if not path.is_file():  # also keeps devices and pipes (which would never end) out of torch.load
            raise ValueError(f"{path.name}: no such adapter file. Fix: pass a file written by save_adapter")
        model = copy.deepcopy(self.model)
        try:
            load_adapter(model, domain, path)
        except Exception as err:  # torch.load of arbitrary bytes raises anything from IndexError to UnpicklingError
            # ValueErrors are load_adapter's own; they name the file, which a caller may see by its name only
            why = str(err).replace(str(path), path.name) if isinstance(err, ValueError) else type(err).__name__
            raise ValueError(
                f"{path.name}: not an adapter file of this model ({why}). Fix: write it with save_adapter from the "
                "model this bundle serves"
            ) from err
        swapped = copy.copy(self)
        swapped.model = model.eval()
        swapped.capabilities = Capabilities.of(swapped.model)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:8]
        swapped._adapters = {**self._adapters, domain: digest}
        swapped._ranking = swapped._history_ranking()
        return swapped

    def domain_index(self, domain: str) -> int:
        """The index of a requested domain; ValueError saying what this bundle serves otherwise."""
        if not self.domains:
            raise ValueError(f"domain {domain!r}: this bundle serves a single domain; omit `domain`")
        if domain not in self.domains:
            raise ValueError(f"unknown domain {domain!r}: this bundle serves {', '.join(self.domains)}")
        return self.domains.index(domain)

    def known_events(self, events: list[Event], now: int) -> tuple[list[int], list[int], list[str]]:
        """(item_idx of the events with a known item, their times, the unknown item ids); an unknown time (0)
        becomes `now`."""
        known = [e for e in events if e.item_id in self._item_idx]
        return (
            [self._item_idx[e.item_id] for e in known],
            [e.ts or now for e in known],
            [e.item_id for e in events if e.item_id not in self._item_idx],
        )

    def user_idx(self, user_id: str) -> int:
        """The user's index in the model's data, 0 for a user the bundle does not know."""
        return self.histories.user_idx(user_id)

    def training_history(self, user_id: str) -> tuple[list[int], list[int]] | None:
        """(item_idx, ts) of the user's interactions in the bundle's data (oldest first), or None for a user it
        does not know."""
        return self.histories.of(user_id)

    def recommend(
        self,
        history: list[int],
        k: int,
        exclude_seen: bool,
        timestamps: list[int] | None = None,
        request_time: int = 0,
    ) -> list[Recommendation]:
        """Top-k for one history (item_idx, oldest first [+ their and the request's unix seconds]): the model's full
        ranking, or popularity when empty."""
        return self.recommend_batch([RecommendationQuery(history, k, exclude_seen, timestamps, request_time)])[0]

    @torch.no_grad()
    def recommend_batch(self, queries: list[RecommendationQuery]) -> list[list[Recommendation]]:
        """Top-k for each query, the histories scored in one model call (those with a text query in another);
        empty histories without a text query get popularity."""
        texts = [i for i, q in enumerate(queries) if q.text]
        ranked = self._with_text([queries[i] for i in texts], texts) if texts else {}
        scored = [i for i, q in enumerate(queries) if q.history and not q.text]
        if scored:
            asked = [queries[i] for i in scored]
            requests = RankingRequests(
                histories=Jagged.from_lists([q.history for q in asked]),
                exclude=torch.tensor([q.exclude_seen for q in asked]),
                domains=[q.domain for q in asked],
                users=torch.tensor([q.user for q in asked]),
                times=self._times(asked) if self._reads_timestamps else None,
            )
            found = self._ranking.top_k(requests, max(q.k for q in asked))
            ranked |= {i: self._describe(*self._top(found, row, queries[i].k)) for row, i in enumerate(scored)}
        return [ranked[i] if i in ranked else self._popularity(q.k, set(), q.domain) for i, q in enumerate(queries)]

    @staticmethod
    def _top(found: Ranked, row: int, k: int) -> tuple[list[int], list[float]]:
        items, scores = found[row]
        return items[:k], scores[:k]

    def _with_text(self, queries: list[RecommendationQuery], rows: list[int]) -> dict[int, list[Recommendation]]:
        """{row: top-k} of queries with a text (and a history, or none): their texts embedded in one encoder call,
        everything ranked by the model in one call."""
        model = self.capabilities.queries
        if model is None or self._queries is None:
            raise ValueError(f"the served {self.name} model takes no text query. Fix: omit `query`, or serve a "
                             "model that reads queries (docs/search.md)")  # fmt: skip
        from recsys.semantic_ids.content import embed_texts

        encoding, encoder = self._queries
        texts = [q.text or "" for q in queries]
        vectors = torch.from_numpy(embed_texts(texts, encoding, encoder=encoder))
        histories = Jagged.from_lists([q.history for q in queries])
        scores = model.score_with_queries(histories.to_padded(self.max_history), vectors, texts)  # (Q, V+1)
        exclude = torch.tensor([q.exclude_seen for q in queries])
        top_scores, top_items = rank_scores(scores, histories, max(q.k for q in queries), exclude)
        return {
            i: self._describe(top_items[row, : q.k].tolist(), top_scores[row, : q.k].tolist())
            for row, (i, q) in enumerate(zip(rows, queries, strict=True))
        }

    @staticmethod
    def _times(queries: list[RecommendationQuery]) -> RequestTimes:
        """The queries' history and request times; a query without them reads as all at one moment (no gaps)."""
        rows = [q.timestamps if q.timestamps is not None else [q.request_time] * len(q.history) for q in queries]
        return RequestTimes(Jagged.from_lists(rows), torch.tensor([q.request_time for q in queries]))

    def popular(self, k: int, exclude: list[int], domain: int = -1) -> list[Recommendation]:
        return self._popularity(k, set(exclude), domain)

    @torch.no_grad()
    def similar_items(self, item_idx: int, k: int) -> list[Recommendation] | None:
        """The k items nearest to `item_idx` by the model's item vectors (itself excluded); None without vectors."""
        vectors = self.capabilities.vectors
        if self._similar is None or vectors is None:
            return None
        table = vectors.item_embeddings() if self._item_table is None else self._item_table
        query = table[item_idx][None].float()
        scores, ids = self._similar.search(query, min(k + 1, self._similar.num_items))
        pairs = [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if int(i) not in (item_idx, -1)]
        return self._describe([i for i, _ in pairs[:k]], [s for _, s in pairs[:k]])

    def _similar_items_index(self, index_dir: Path | None) -> TopK | None:
        """The bundle's FAISS index of the model's item vectors, or exact search over them; None without vectors."""
        vectors = self.capabilities.vectors
        if vectors is None:
            return None
        if index_dir is not None:
            from recsys.retrieval.faiss_index import FaissTopK

            return FaissTopK.load(index_dir)
        with torch.no_grad():  # a content-first model's table is computed already
            table = (vectors.item_embeddings() if self._item_table is None else self._item_table)[1:].float()
        return ExactTopK(table, torch.arange(1, table.shape[0] + 1))

    def _popularity(self, k: int, exclude: set[int], domain: int = -1) -> list[Recommendation]:
        popular = self._popular
        domains = self.capabilities.domains
        if domain >= 0 and domains is not None:
            popular = popular[domains.item_domain[popular] == domain]
        items = [int(i) for i in popular if int(i) not in exclude][:k]
        return self._describe(items, [float(self.catalogue.item_counts[i]) for i in items])

    def _describe(self, items: list[int], scores: list[float]) -> list[Recommendation]:
        trained = self.catalogue.num_items
        titles = [self.catalogue.title(i) if i <= trained else self._added[i - trained - 1].title for i in items]
        return [
            Recommendation(self._item_ids[i], title, score)
            for i, title, score in zip(items, titles, scores, strict=True)
        ]


class _OnFirstUse:
    """A text encoder loaded when it first encodes (`load`), named by its cache key before then."""

    def __init__(self, cache_key: str, load: Callable[[], TextEncoder]) -> None:
        self.cache_key, self._load = cache_key, load

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self._load().encode(texts)
