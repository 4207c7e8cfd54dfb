"""A real headless Chromium for the tests of pages (the dashboard, /docs): find it, run it, read its screenshots.

Without Chromium a browser test skips with the install command; under CI=true it fails with it (CI installs it).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

INSTALL_HINT = "apt-get install -y chromium"
# no host but this machine's resolves: a page that needs the internet (a CDN) shows it
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"


def chromium_or_skip() -> str:
    """The Chromium binary; without one, a skip naming the install command (a failure under CI=true)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = f"chromium is not installed: the browser tests need it. Fix: {INSTALL_HINT}"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return found


def run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Chromium, headless, offline (`OFFLINE`), 1200x800, with `args` (`--dump-dom URL`, `--screenshot=PNG URL`)."""
    command = [
        chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
        "--window-size=1200,800", "--virtual-time-budget=10000", OFFLINE, *args,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def read_png(path: Path) -> np.ndarray:
    """(H, W, C) uint8 pixels of an 8-bit, non-interlaced RGB(A) PNG: the chunks, zlib, and the five row filters."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, header = 8, bytearray(), None
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", data[pos + 8 : pos + 8 + length])
        elif kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    assert header is not None
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    stride, raw = width * bpp, zlib.decompress(bytes(idat))
    rows, previous = np.zeros((height, stride), dtype=np.uint8), np.zeros(stride, dtype=np.int64)
    for y in range(height):
        kind_of_filter, start = raw[y * (stride + 1)], y * (stride + 1) + 1
        line = np.frombuffer(raw, dtype=np.uint8, count=stride, offset=start).astype(np.int64)
        if kind_of_filter == 0:
            row = line
        elif kind_of_filter == 1:  # Sub: a running sum per channel
            row = line.reshape(width, bpp).cumsum(axis=0).reshape(-1) % 256
        elif kind_of_filter == 2:  # Up
            row = (line + previous) % 256
        else:  # Average, Paeth: sequential within the row
            row = np.array(_unfilter_sequential(kind_of_filter, line.tolist(), previous.tolist(), bpp))
        rows[y], previous = row, row
    return rows.reshape(height, width, bpp)


def _unfilter_sequential(kind: int, line: list[int], up: list[int], bpp: int) -> list[int]:
    out = [0] * len(line)
    for i, x in enumerate(line):
        a, b = (out[i - bpp], up[i]) if i >= bpp else (0, up[i])
        if kind == 3:
            out[i] = (x + (a + b) // 2) & 255
            continue
        c = up[i - bpp] if i >= bpp else 0
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        out[i] = (x + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    return out
