"""One closed-loop HTTP reader, a process of its own: GET a URL, one request after another, until SIGTERM; prints
`ready` after its first answer and, on SIGTERM, how many requests it made. It imports httpx alone, so several start in
a second beside a measured client (threads would share that client's GIL; a process importing the benchmark package
would spend seconds of CPU importing torch).

Usage:
    .venv/bin/python -m benchmarks.load_reader http://127.0.0.1:8000/dashboard --header X-API-Key=KEY
"""

from __future__ import annotations

import argparse
import signal
import sys
from types import FrameType

import httpx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    headers = dict(pair.split("=", 1) for pair in args.header)
    stopped = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    count = 0
    with httpx.Client(headers=headers, timeout=120) as client:
        while not stopped:
            client.get(args.url)
            count += 1
            if count == 1:
                print("ready", flush=True)
    print(count, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
