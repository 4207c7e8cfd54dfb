"""Top-k retrieval over item vectors: one `TopK` interface, exact torch search (the reference) and FAISS indexes."""

from recsys.retrieval.base import TopK
from recsys.retrieval.exact import ExactTopK
from recsys.retrieval.faiss_index import FaissTopK, IndexConfig, build_index
from recsys.retrieval.recall import recall_at_k

__all__ = ["ExactTopK", "FaissTopK", "IndexConfig", "TopK", "build_index", "recall_at_k"]
