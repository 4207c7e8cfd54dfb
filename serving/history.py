"""Online user histories: what users just did, appended by `POST /v1/events`, read by every recommendation.

Two stores behind one protocol: in-process (the embedded default, lost on restart) and Redis (a list per
user, trimmed to the most recent `max_history` events, shared by API replicas). A store that cannot answer
raises `HistoryUnavailableError`; the API then serves from the bundle's histories alone and says so.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from typing import ClassVar, Protocol


class HistoryUnavailableError(RuntimeError):
    """The online history store did not answer (e.g. Redis is down)."""


class HistoryStore(Protocol):
    # True when calls wait on the network: async endpoints then call the store from a worker thread
    blocking_io: ClassVar[bool]

    def recent(self, user_id: str) -> list[str]:
        """The user's online events, oldest first (item ids)."""
        ...

    def append(self, user_id: str, item_ids: list[str]) -> None: ...

    def ping(self) -> None:
        """Raise `HistoryUnavailableError` when the store cannot answer."""
        ...


class InMemoryHistoryStore:
    """Per-process histories (thread-safe), the most recent `max_history` per user."""

    blocking_io: ClassVar[bool] = False

    def __init__(self, max_history: int) -> None:
        self._events: defaultdict[str, deque[str]] = defaultdict(lambda: deque(maxlen=max_history))
        self._lock = threading.Lock()

    def recent(self, user_id: str) -> list[str]:
        with self._lock:
            return list(self._events.get(user_id, ()))

    def append(self, user_id: str, item_ids: list[str]) -> None:
        with self._lock:
            self._events[user_id].extend(item_ids)

    def ping(self) -> None:
        return None


class RedisHistoryStore:
    """A Redis list `recsys:history:<user_id>` per user, trimmed to the most recent `max_history` events."""

    blocking_io: ClassVar[bool] = True

    def __init__(self, url: str, max_history: int, timeout_s: float = 0.5) -> None:
        import redis

        self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._errors = (redis.RedisError, OSError)
        self.max_history = max_history

    def recent(self, user_id: str) -> list[str]:
        try:
            values = self._redis.lrange(self._key(user_id), 0, -1)
        except self._errors as err:
            raise HistoryUnavailableError(f"Redis history store: {err}") from err
        return [v.decode() for v in values]  # type: ignore[union-attr]

    def append(self, user_id: str, item_ids: list[str]) -> None:
        key = self._key(user_id)
        try:
            with self._redis.pipeline(transaction=True) as pipe:
                pipe.rpush(key, *item_ids)
                pipe.ltrim(key, -self.max_history, -1)
                pipe.execute()
        except self._errors as err:
            raise HistoryUnavailableError(f"Redis history store: {err}") from err

    def ping(self) -> None:
        try:
            self._redis.ping()
        except self._errors as err:
            raise HistoryUnavailableError(f"Redis history store: {err}") from err

    @staticmethod
    def _key(user_id: str) -> str:
        return f"recsys:history:{user_id}"
