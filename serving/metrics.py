"""Prometheus metrics of one app: requests by route and status, request latency, model calls and batch sizes,
each candidate source's time and failures (a ranker with several sources),
champion reloads and their failures, whether the online history store answers, items added at run time, and the
garbage collector's pauses by generation (a full collection stops every request at once).

Each app owns its registry (several apps in one process, e.g. tests, do not collide); `GET /metrics`
serves it in the Prometheus text format. Requests are observed by a plain ASGI middleware (Starlette's
`@app.middleware("http")` wraps every request in extra tasks and streams, a cost paid on the hot path).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from recsys.models.sources import SourceCall

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class ServingMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "recsys_http_requests", "HTTP requests by route and status", ["route", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "recsys_http_request_seconds", "HTTP request latency by route", ["route"], buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.model_call = Histogram(
            "recsys_model_call_seconds", "latency of one model call (a micro-batch of recommendation requests)",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.batch_size = Histogram(
            "recsys_model_batch_size", "recommendation requests scored per model call", buckets=_BATCH_BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.source_call = Histogram(
            "recsys_candidate_source_seconds", "time of one candidate source within one model call (ranker sources)",
            ["source"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.source_failures = Counter(
            "recsys_candidate_source_failures", "model calls in which a candidate source failed and was skipped",
            ["source"], registry=self.registry,
        )  # fmt: skip
        self.reloads = Counter("recsys_model_reloads", "champions loaded and swapped in", registry=self.registry)
        self.reload_failures = Counter(
            "recsys_model_reload_failures", "champion checks that failed (registry down or bundle unloadable)",
            registry=self.registry,
        )  # fmt: skip
        self.items_added = Counter(
            "recsys_items_added", "items added at run time (POST /v1/admin/items), re-adds included",
            registry=self.registry,
        )  # fmt: skip
        self.live_added_items = Gauge(
            "recsys_added_items_live", "items added at run time that the served model ranks now", registry=self.registry
        )
        self.history_store_up = Gauge(
            "recsys_history_store_up", "1 when the online history store answered its last call, else 0",
            registry=self.registry,
        )  # fmt: skip

        self.gc_pauses = Histogram(
            "recsys_gc_pause_seconds", "garbage collections of this process by generation (2: full), and their pauses",
            ["generation"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip

    def watch_collections(self) -> Callable[[], None]:
        """Time every garbage collection of the process from now on; returns what stops it (the callback is the
        interpreter's, shared by every app of the process)."""
        started = [0.0]

        def observe(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                self.gc_pauses.labels(str(info["generation"])).observe(time.perf_counter() - started[0])

        gc.callbacks.append(observe)
        return lambda: gc.callbacks.remove(observe)

    def observe_sources(self, calls: Iterable[SourceCall]) -> None:
        """Each candidate source's part of one model call."""
        for call in calls:
            self.source_call.labels(call.source).observe(call.seconds)
            if call.failed:
                self.source_failures.labels(call.source).inc()

    def install(self, app: FastAPI) -> None:
        """Count and time every request (by its route template, so ids do not explode the label set)."""
        app.add_middleware(_ObserveRequests, metrics=self)

        @app.get("/metrics", include_in_schema=False)
        def metrics() -> Response:
            return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class _ObserveRequests:
    def __init__(self, app: ASGIApp, metrics: ServingMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the client gets if the app raises before starting a response

        async def send_observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        finally:
            route = getattr(scope.get("route"), "path_format", "unmatched")  # the template, converters dropped
            self.metrics.requests.labels(route, str(status)).inc()
            self.metrics.latency.labels(route).observe(time.perf_counter() - start)
