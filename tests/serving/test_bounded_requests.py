"""Every request is bounded and every bad one gets a clear 4xx: body size (413 before parsing), ids, lists and
timestamps, text that is not Unicode, unparseable JSON (400), 422 bodies that do not echo the input, and a
property-based sweep over the request schemas with arbitrary Unicode asserting no 5xx."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recsys.data.schema import MAX_TIMESTAMP
from serving.main import create_app
from serving.schemas import MAX_ECHOED_IDS, MAX_ID_CHARS
from serving.settings import ServingSettings


@pytest.fixture(scope="module")
def client(registry: tuple[str, str, Path]) -> Iterator[TestClient]:
    uri, name, _ = registry
    with TestClient(create_app(ServingSettings(model_name=name, tracking_uri=uri, max_body_bytes=64 * 1024))) as c:
        yield c


def test_a_body_over_the_limit_is_413_before_it_is_parsed(client: TestClient) -> None:
    declared = client.post(
        "/v1/recommendations", content=b"x" * (64 * 1024 + 1), headers={"content-type": "application/json"}
    )
    chunks = (b"[" + b"1," * 1024 for _ in range(64))  # no Content-Length: streamed, counted as it arrives
    streamed = client.post("/v1/events", content=chunks, headers={"content-type": "application/json"})
    for response in (declared, streamed):
        assert response.status_code == 413 and "larger than 65536 bytes" in response.json()["detail"]


@pytest.mark.parametrize("route", ["/v1/recommendations", "/v1/events"])
def test_a_lone_surrogate_is_a_400_not_a_500(client: TestClient, route: str) -> None:
    body = b'{"user_id": "\\ud800", "item_ids": ["a"]}'
    response = client.post(route, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "valid Unicode" in response.json()["detail"]


def test_unparseable_json_is_400_as_documented(client: TestClient) -> None:
    response = client.post("/v1/recommendations", content=b'{"user_id": ', headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["detail"].startswith("the body is not valid JSON")


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("/v1/events", {"user_id": "u", "item_ids": ["i" * (MAX_ID_CHARS + 1)]}, "item_ids"),
        ("/v1/recommendations", {"history": ["i" * (MAX_ID_CHARS + 1)]}, "history"),
        ("/v1/recommendations", {"user_id": "u" * (MAX_ID_CHARS + 1)}, "user_id"),
        ("/v1/events", {"user_id": "u", "item_ids": ["a"], "timestamps": [2**63]}, "timestamps"),
        ("/v1/events", {"user_id": "u", "item_ids": ["a"], "timestamps": [MAX_TIMESTAMP + 1]}, "timestamps"),
        ("/v1/events", {"user_id": "u", "item_ids": ["a"] * 101}, "item_ids"),
        ("/v1/recommendations", {"history": ["a"], "domain": "d" * 65}, "domain"),
    ],
)
def test_ids_lists_and_timestamps_are_bounded(client: TestClient, route: str, body: dict, field: str) -> None:
    response = client.post(route, json=body)
    assert response.status_code == 422
    assert any(field in error["loc"] for error in response.json()["detail"])


def test_a_422_does_not_echo_a_large_input(client: TestClient) -> None:
    huge = "x" * 30_000  # two of them stay under the 64 KiB body limit
    response = client.post("/v1/events", json={"user_id": huge, "item_ids": [huge]})
    assert response.status_code == 422 and len(response.content) < 2_000 and huge[:300] not in response.text
    assert all(set(error) == {"type", "loc", "msg"} for error in response.json()["detail"])


def test_an_over_long_similar_items_id_is_refused_without_an_echo(client: TestClient) -> None:
    response = client.get("/v1/similar-items/" + "x" * 65_000)
    assert response.status_code == 422 and len(response.content) < 2_000 and "x" * 300 not in response.text
    assert any("item_id" in error["loc"] for error in response.json()["detail"])


def test_unknown_ids_are_counted_and_only_the_first_few_named(client: TestClient) -> None:
    unknown = [f"no-such-item-{i:04d}" for i in range(1_000)]
    recommended = client.post("/v1/recommendations", json={"history": unknown, "k": 3})
    posted = client.post("/v1/events", json={"user_id": "echo", "item_ids": unknown[:100]})
    for response, sent in ((recommended, 1_000), (posted, 100)):
        body = response.json()
        assert response.status_code == 200 and body["unknown_count"] == sent
        assert body["unknown_items"] == unknown[:MAX_ECHOED_IDS]
    assert len(recommended.content) < 3_000  # not the ~20 kB of ids sent


identifiers = st.text(max_size=40)  # any Unicode, surrogates and control characters included
timestamps = st.integers(min_value=-(2**70), max_value=2**70)
recommendation_bodies = st.fixed_dictionaries(
    {},
    optional={
        "user_id": identifiers,
        "history": st.lists(identifiers, max_size=5),
        "timestamps": st.lists(timestamps, max_size=5),
        "k": st.integers(min_value=-5, max_value=200),
        "exclude_seen": st.booleans(),
        "domain": st.none() | identifiers,
    },
)
event_bodies = st.fixed_dictionaries(
    {},
    optional={
        "user_id": identifiers,
        "item_ids": st.lists(identifiers, max_size=5),
        "timestamps": st.lists(timestamps, max_size=5),
    },
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], derandomize=True
)
@given(route_and_body=st.one_of(st.tuples(st.just("/v1/recommendations"), recommendation_bodies),
                                st.tuples(st.just("/v1/events"), event_bodies)))  # fmt: skip
def test_no_request_body_causes_a_server_error(client: TestClient, route_and_body: tuple[str, dict]) -> None:
    route, body = route_and_body
    # ensure_ascii (the default) writes lone surrogates as \\ud800 escapes, as a client's encoder would send them
    response = client.post(route, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    assert response.status_code < 500, (body, response.text)
    assert response.status_code in (200, 400, 422, 503), (body, response.status_code)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], derandomize=True)
@given(item_id=st.text(min_size=1, max_size=40), k=st.integers(min_value=-5, max_value=200))
def test_no_similar_items_path_causes_a_server_error(client: TestClient, item_id: str, k: int) -> None:
    path = quote(item_id.encode("utf-8", "surrogatepass"), safe="")
    response = client.get(f"/v1/similar-items/{path}", params={"k": k})
    assert response.status_code < 500, (item_id, response.text)


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain", "application/xml"])
@pytest.mark.parametrize("route", ["/v1/recommendations", "/v1/events", "/v1/search"])
def test_a_body_not_sent_as_json_is_415_saying_which_header_to_send(
    client: TestClient, route: str, content_type: str | None
) -> None:
    """`curl -d` sends a form's content type: the answer names the header to send, not 'a valid dictionary'."""
    headers = {} if content_type is None else {"content-type": content_type}
    response = client.post(route, content=b'{"user_id": "u00001", "item_ids": ["x"], "query": "x"}', headers=headers)
    assert response.status_code == 415, response.text
    assert "Content-Type: application/json" in response.json()["detail"] and "Fix:" in response.json()["detail"]
    documented = client.get("/openapi.json").json()["paths"][route]["post"]["responses"]
    assert "415" in documented
    assert (
        client.post(route, content=b"{}", headers={"content-type": "application/json; charset=utf-8"}).status_code
        != 415
    )
