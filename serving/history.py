"""Online user histories: what users just did, appended by `POST /v1/events`, read by every recommendation.

Two stores behind one protocol: in-process (the embedded default, lost on restart; the least recently active
users dropped beyond `max_users`) and Redis (a list per user, trimmed to the most recent `events_per_user` events,
expiring `ttl_s` after the user's last event, shared by workers and replicas). A store that cannot answer raises
`HistoryUnavailableError`; the API then serves from the bundle's histories alone and says so. The Redis store
logs when it goes down and when it is back (once each, not per request) and keeps `available` for /metrics.
Every event keeps its time (unix seconds), which time-aware models read.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict, deque
from typing import ClassVar, NamedTuple, Protocol

logger = logging.getLogger(__name__)


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
    available: bool  # whether the last call was answered

    def recent(self, user_id: str) -> list[Event]:
        """The user's online events, oldest first."""
        ...

    def append(self, user_id: str, events: list[Event]) -> None: ...

    def ping(self) -> None:
        """Raise `HistoryUnavailableError` when the store cannot answer."""
        ...


class InMemoryHistoryStore:
    """Per-process histories (thread-safe), the most recent `events_per_user` of at most `max_users` users: the
    least recently active user is dropped first, so memory stays bounded whatever ids clients send."""

    blocking_io: ClassVar[bool] = False
    available = True

    def __init__(self, events_per_user: int, max_users: int) -> None:
        self.events_per_user, self.max_users = events_per_user, max_users
        self._events: OrderedDict[str, deque[Event]] = OrderedDict()
        self._lock = threading.Lock()

    def recent(self, user_id: str) -> list[Event]:
        with self._lock:
            return list(self._events.get(user_id, ()))

    def append(self, user_id: str, events: list[Event]) -> None:
        with self._lock:
            if user_id not in self._events:
                self._events[user_id] = deque(maxlen=self.events_per_user)
                if len(self._events) > self.max_users:
                    self._events.popitem(last=False)
            self._events.move_to_end(user_id)
            self._events[user_id].extend(events)

    def __len__(self) -> int:
        """Users held."""
        return len(self._events)

    def ping(self) -> None:
        return None


class RedisHistoryStore:
    """A Redis list `recsys:history:<user_id>` per user, trimmed to the most recent `events_per_user` events and
    expiring `ttl_s` seconds after the user's last event."""

    blocking_io: ClassVar[bool] = True

    def __init__(self, url: str, events_per_user: int, ttl_s: int, timeout_s: float = 0.5) -> None:
        import redis

        self._redis = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._errors = (redis.RedisError, OSError)
        self.url, self.events_per_user, self.ttl_s = url, events_per_user, ttl_s
        self.available = True
        self._state_lock = threading.Lock()

    def recent(self, user_id: str) -> list[Event]:
        try:
            values = self._redis.lrange(self._key(user_id), 0, -1)
        except self._errors as err:
            raise self._down(err) from err
        self._up()
        return [decode_event(v.decode()) for v in values]  # type: ignore[union-attr]

    def append(self, user_id: str, events: list[Event]) -> None:
        key = self._key(user_id)
        try:
            with self._redis.pipeline(transaction=True) as pipe:
                pipe.rpush(key, *map(encode_event, events))
                pipe.ltrim(key, -self.events_per_user, -1)
                pipe.expire(key, self.ttl_s)
                pipe.execute()
        except self._errors as err:
            raise self._down(err) from err
        self._up()

    def ping(self) -> None:
        try:
            self._redis.ping()
        except self._errors as err:
            raise self._down(err) from err
        self._up()

    def _down(self, err: Exception) -> HistoryUnavailableError:
        with self._state_lock:
            if self.available:
                logger.warning(
                    "Redis history store at %s is down (%s): serving bundle histories only, refusing events (503) "
                    "until it answers again", self._redacted_url(), err,
                )  # fmt: skip
            self.available = False
        return HistoryUnavailableError(f"Redis history store: {err}")

    def _up(self) -> None:
        if self.available:
            return
        with self._state_lock:
            if not self.available:
                logger.info("Redis history store at %s is back", self._redacted_url())
            self.available = True

    def _redacted_url(self) -> str:
        """The URL without its password (logs are read by more people than the secret's owner)."""
        kwargs = self._redis.connection_pool.connection_kwargs
        return f"{kwargs.get('host', kwargs.get('path', '?'))}:{kwargs.get('port', '')}/{kwargs.get('db', 0)}"

    @staticmethod
    def _key(user_id: str) -> str:
        return f"recsys:history:{user_id}"
