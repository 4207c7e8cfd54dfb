"""Top-k retrieval over item vectors: one `TopK` interface, exact torch search (the reference) and FAISS indexes.

FAISS-backed search lives in `recsys.retrieval.faiss_index` (imported from there, so that configs and exact
search load without faiss).
"""

from recsys.retrieval.base import TopK
from recsys.retrieval.config import IndexConfig
from recsys.retrieval.exact import ExactTopK
from recsys.retrieval.recall import recall_at_k

__all__ = ["ExactTopK", "IndexConfig", "TopK", "recall_at_k"]
