"""A chat-completions server of the project's own for the enrich HTTP backend's tests (no llama.cpp server is built
here): OpenAI's request and answer shapes, scripted per item text. Its fixture is
shared through tests/conftest.py."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

CATEGORY = "Beauty > Skin Care"


@dataclass
class ChatServer:
    """What the server saw, and how it behaves. Item texts script it: "malformed" answers garbage until re-asked,
    "hopeless" always, "busy" is refused with a 429 once."""

    url: str = ""
    delay_s: float = 0.0
    accepts_schema: bool = True
    tokens_per_answer: int = 100
    asked: Counter[str] = field(default_factory=Counter)
    authorizations: set[str] = field(default_factory=set)
    schemas_refused: int = 0

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if "response_format" in body and not self.accepts_schema:
            self.schemas_refused += 1
            return 400, {"error": {"message": "response_format is not supported by this server"}}
        item = [m["content"] for m in body["messages"] if m["role"] == "user" and m["content"].startswith("Item:")][-1]
        text = item.removeprefix("Item: ")
        reasked = "not valid" in body["messages"][-1]["content"]
        self.asked[text] += 1
        time.sleep(self.delay_s)
        if "busy" in text and self.asked[text] == 1:
            return 429, {"error": {"message": "slow down"}}
        if "hopeless" in text or ("malformed" in text and not reasked):
            content = "I think the category is skin care, the brand"
        else:
            words = re.findall(r"\w+", text.lower())
            content = json.dumps(
                {
                    "category": CATEGORY,
                    "brand": words[0].title(),
                    "keywords": words[:3],
                    "description": f"A {words[0]} item.",
                    "queries": [" ".join(words[:2]), words[-1]],
                }
            )
        usage = {"total_tokens": self.tokens_per_answer}
        return 200, {"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                     "usage": usage}  # fmt: skip


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    server = ChatServer()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            server.authorizations.add(self.headers.get("Authorization", ""))
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            status, payload = server.answer(body) if self.path == "/v1/chat/completions" else (404, {})
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 429:
                self.send_header("Retry-After", "0")
            self.end_headers()
            with contextlib.suppress(BrokenPipeError):  # a client killed mid-request
                self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield server
    httpd.shutdown()
