"""Prometheus metrics of one app: requests by route and status, request latency, model-call latency.

Each app owns its registry (several apps in one process, e.g. tests, do not collide); `GET /metrics`
serves it in the Prometheus text format.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


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
            "recsys_model_call_seconds", "latency of the model call alone (scoring one request)",
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip

    def install(self, app: FastAPI) -> None:
        """Count and time every request (by its route template, so ids do not explode the label set)."""

        @app.middleware("http")
        async def observe(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
            start = time.perf_counter()
            response = await call_next(request)
            route = getattr(request.scope.get("route"), "path", "unmatched")
            self.requests.labels(route, str(response.status_code)).inc()
            self.latency.labels(route).observe(time.perf_counter() - start)
            return response

        @app.get("/metrics", include_in_schema=False)
        def metrics() -> Response:
            return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
