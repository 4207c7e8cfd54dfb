"""benchmarks.load_reader: a reader process says when it is ready, reads until SIGTERM, and reports its count."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from benchmarks.common import REPO


class _Counting(BaseHTTPRequestHandler):
    served: ClassVar[int] = 0
    headers_seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).served += 1
        type(self).headers_seen.append(self.headers.get("X-API-Key", ""))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/dashboard"
    httpd.shutdown()


def test_a_reader_counts_its_requests_until_stopped(server: str) -> None:
    reader = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.load_reader", server, "--header=X-API-Key=k1"],
        stdout=subprocess.PIPE, text=True, cwd=REPO,
    )  # fmt: skip
    assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"
    reader.terminate()
    count = int(reader.communicate(timeout=30)[0].strip())
    assert reader.returncode == 0
    assert 1 <= count <= _Counting.served  # every request it counted reached the server
    assert set(_Counting.headers_seen) == {"k1"}
