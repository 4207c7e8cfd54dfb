"""Online user histories: what users just did, appended by `POST /v1/events`, read by every recommendation.

Two stores behind one protocol: in-process (the embedded default, lost on restart) and Redis (a list per
user, trimmed to the most recent `events_per_user` events, shared by API replicas). A store that cannot answer
raises `HistoryUnavailableError`; the API then serves from the bundle's histories alone and says so.
Every event keeps its time (unix seconds), which time-aware models read.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict, deque
from typing import ClassVar, NamedTuple, Protocol


class Event(NamedTuple):
    item_id: str
    ts: int  # unix seconds


def encode_event(event: Event) -> str:
    return json.dumps([event.item_id, event.ts])


def decode_event(raw: str) -> Event:
    """The stored form back; a bare item id (what stores held before events kept their time) gets ts 0."""
    try:
        item_id, ts = json.loads(raw)
        return Event(str(item_id), int(ts))
    except (ValueError, TypeError):
        return Event(raw, 0)


class HistoryUnavailableError(RuntimeError):
    """The online history store did not answer (e.g. Redis is down)."""


class HistoryStore(Protocol):
    # True when calls wait on the network: async endpoints then call the store from a worker thread
    blocking_io: ClassVar[bool]

    def recent(self, user_id: str) -> list[Event]:
        """The user's online events, oldest first."""
        ...

    def append(self, user_id: str, events: list[Event]) -> None: ...

    def ping(self) -> None:
        """Raise `HistoryUnavailableError` when the store cannot answer."""
        ...


class InMemoryHistoryStore:
    """Per-process histories (thread-safe), the most recent `events_per_user` per user."""

    blocking_io: ClassVar[bool] = False

    def __init__(self, events_per_user: int) -> None:
        self._events: defaultdict[str, deque[Event]] = defaultdict(lambda: deque(maxlen=events_per_user))
        self._lock = threading.Lock()

    def recent(self, user_id: str) -> list[Event]:
        with self._lock:
            return list(self._events.get(user_id, ()))

    def append(self, user_id: str, events: list[Event]) -> None:
        with self._lock:
            self._events[user_id].extend(events)

    def ping(self) -> None:
        return None


class RedisHistoryStore:
    """A Redis list `recsys:history:<user_id>` per user, trimmed to the most recent `events_per_user` events."""

    blocking_io: ClassVar[bool] = True

    def __init__(self, url: str, events_per_user: int, timeout_s: float = 0.5) -> None:
        import redis

        self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._errors = (redis.RedisError, OSError)
        self.events_per_user = events_per_user

    def recent(self, user_id: str) -> list[Event]:
        try:
            values = self._redis.lrange(self._key(user_id), 0, -1)
        except self._errors as err:
            raise HistoryUnavailableError(f"Redis history store: {err}") from err
        return [decode_event(v.decode()) for v in values]  # type: ignore[union-attr]

    def append(self, user_id: str, events: list[Event]) -> None:
        key = self._key(user_id)
        try:
            with self._redis.pipeline(transaction=True) as pipe:
                pipe.rpush(key, *map(encode_event, events))
                pipe.ltrim(key, -self.events_per_user, -1)
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
