"""A chat-completions server of the project's own for the enrich HTTP backend's tests (no llama.cpp server is built
here): OpenAI's request and answer shapes on a real loopback port, scripted per item text, and able to misbehave in
each way a real server or the network does (`MISBEHAVIOURS`). Its fixture `chat_server` is shared through
tests/conftest.py; `serve_chat` runs one outside pytest (the reliability replay), `closed_port_url` names a server
that is not there."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

CATEGORY = "Beauty > Skin Care"

# what a misbehaving request gets instead of its answer
MISBEHAVIOURS = {
    "html": "200 with an HTML page (a proxy's error page)",
    "list": "200 whose body is `[]`",
    "no-choices": '200 with `{"choices": []}`',
    "usage-text": '200 with the answer and `"usage": "x"`',
    "usage-lots": '200 with the answer and `"usage": {"total_tokens": "lots"}`',
    "huge": "200 with a 2 MB body",
    "rate-limited": "429 with `Retry-After: <retry_after>` (any text: -1, nan, 1e12)",
    "error-500": "500 with a JSON error",
    "unauthorized": "401 (a wrong key)",
    "drop": "the connection closed without an answer",
    "trickle": "the answer, one byte every `trickle_s` seconds (status line and headers included)",
}


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()
    delivery: str = "whole"  # whole | drop (the connection closed, nothing sent) | trickle (a byte every trickle_s)


@dataclass
class ChatServer:
    """What the server saw, and how it behaves. Item texts script the answers: "malformed" answers garbage until
    re-asked, "hopeless" always, "busy" is refused with a 429 once. `misbehaviour` (a key of MISBEHAVIOURS) replaces
    the answer of every `every`-th request after the first `start_after`, starting with the first of them."""

    url: str = ""
    delay_s: float = 0.0
    accepts_schema: bool = True
    tokens_per_answer: int = 100
    misbehaviour: str | None = None
    every: int = 1
    start_after: int = 0
    retry_after: str = "0"
    trickle_s: float = 1.0
    requests: int = 0  # every request asking for an item, misbehaved or not
    asked: Counter[str] = field(default_factory=Counter)  # the requests per item text
    authorizations: set[str] = field(default_factory=set)
    schemas_refused: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reply(self, body: dict[str, Any]) -> Reply:
        if "response_format" in body and not self.accepts_schema:
            self.schemas_refused += 1
            return _json(400, {"error": {"message": "response_format is not supported by this server"}})
        item = [m["content"] for m in body["messages"] if m["role"] == "user" and m["content"].startswith("Item:")][-1]
        text = item.removeprefix("Item: ")
        with self._lock:
            self.requests += 1
            self.asked[text] += 1
            number, times = self.requests, self.asked[text]
        if (
            self.misbehaviour is not None
            and number > self.start_after
            and (number - self.start_after - 1) % self.every == 0
        ):
            return self._misbehave(self.misbehaviour, text)
        time.sleep(self.delay_s)
        if "busy" in text and times == 1:
            return _json(429, {"error": {"message": "slow down"}}, headers=(("Retry-After", "0"),))
        reasked = "not valid" in body["messages"][-1]["content"]
        return _json(200, self.completion(text, good=not ("hopeless" in text or ("malformed" in text and not reasked))))

    def completion(self, text: str, *, good: bool = True) -> dict[str, Any]:
        """The chat completion answering for `text`: a valid record, or (not `good`) prose that is none."""
        content = "I think the category is skin care, the brand"
        if good:
            words = re.findall(r"\w+", text.lower())
            record = {"category": CATEGORY, "brand": words[0].title(), "keywords": words[:3],
                      "description": f"A {words[0]} item.", "queries": [" ".join(words[:2]), words[-1]]}  # fmt: skip
            content = json.dumps(record)
        return {"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                "usage": {"total_tokens": self.tokens_per_answer}}  # fmt: skip

    def _misbehave(self, how: str, text: str) -> Reply:
        if how == "html":
            return Reply(200, b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html")
        if how == "list":
            return Reply(200, b"[]")
        if how == "no-choices":
            return Reply(200, b'{"choices": []}')
        if how == "huge":
            return Reply(200, b'{"choices": [], "padding": "' + b"x" * (2 << 20) + b'"}')
        if how == "rate-limited":
            return _json(429, {"error": {"message": "slow down"}}, headers=(("Retry-After", self.retry_after),))
        if how == "error-500":
            return _json(500, {"error": {"message": "the model crashed"}})
        if how == "unauthorized":
            return _json(401, {"error": {"message": "invalid api key"}})
        payload = self.completion(text)
        if how == "usage-text":
            payload["usage"] = "x"
        elif how == "usage-lots":
            payload["usage"] = {"total_tokens": "lots"}
        else:
            assert how in ("drop", "trickle"), f"unknown misbehaviour {how!r}: one of {sorted(MISBEHAVIOURS)}"
            return _json(200, payload, delivery=how)
        return _json(200, payload)


def _json(status: int, payload: object, **reply: Any) -> Reply:
    return Reply(status, json.dumps(payload).encode(), **reply)


@contextlib.contextmanager
def serve_chat(server: ChatServer | None = None) -> Iterator[ChatServer]:
    """`server` (a new one by default) on a free loopback port, its `url` set, until the block ends."""
    server = server or ChatServer()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real servers do (Content-Length is always sent)

        def do_POST(self) -> None:
            server.authorizations.add(self.headers.get("Authorization", ""))
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            reply = server.reply(body) if self.path == "/v1/chat/completions" else Reply(404, b"{}")
            if reply.delivery == "drop":
                self.close_connection = True
                return
            head = (f"HTTP/1.1 {reply.status} {self.responses.get(reply.status, ('',))[0]}\r\n"
                    f"Content-Type: {reply.content_type}\r\nContent-Length: {len(reply.body)}\r\n"
                    + "".join(f"{name}: {value}\r\n" for name, value in reply.headers) + "\r\n").encode()  # fmt: skip
            with contextlib.suppress(OSError):  # a client gone (killed, or timed out on a trickle)
                if reply.delivery == "trickle":
                    for byte in head + reply.body:
                        self.wfile.write(bytes([byte]))
                        time.sleep(server.trickle_s)
                else:
                    self.wfile.write(head + reply.body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    class Quiet(ThreadingHTTPServer):
        def handle_error(self, request: object, client_address: object) -> None:
            pass  # a client gone mid-request (cut at its timeout) is what the tests do on purpose

    httpd = Quiet(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()


def closed_port_url() -> str:
    """The URL of a server that is not there: a loopback port just bound and closed (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    with serve_chat() as server:
        yield server
