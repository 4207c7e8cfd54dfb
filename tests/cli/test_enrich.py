"""`recsys enrich`: options and inputs it cannot use are refused with exit 2 and their fix before any model is loaded
or anything asked; an outage exits 2 saying how to go on; a run over an OpenAI-compatible server writes the
catalogue's records (the server: tests/chat_server.py) and keeps its cache in the user's cache directory."""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from cli import app
from tests.chat_server import ChatServer, closed_port_url

runner = CliRunner()


def _catalogue(folder: Path) -> Path:
    folder.mkdir()
    pl.DataFrame({"item_idx": [1, 2], "item_id": ["a", "b"], "title": ["Acme Lip Balm Stick", "Zest Body Wash Gel"]}
                 ).write_parquet(folder / "items.parquet")  # fmt: skip
    return folder


def test_unusable_options_exit_2_with_the_fix(tmp_path: Path) -> None:
    data = _catalogue(tmp_path / "data")
    cases = [
        (["--backend", "cloud"], "--backend 'cloud' is not local or http"),
        (["--backend", "http"], "needs enrich.url"),
        (["--first", str(tmp_path / "none.txt")], "no such file"),
        (["--model", str(tmp_path / "nothing")], "neither 'gemma3-270m', a .gguf file nor a Hugging Face"),
    ]
    for options, says in cases:
        result = runner.invoke(app, ["enrich", "--data-dir", str(data), "--cache-dir", str(tmp_path / "c"), *options])
        assert result.exit_code == 2 and says in result.output, (options, result.output)


def test_a_run_over_a_server_writes_the_records(chat_server: ChatServer, tmp_path: Path) -> None:
    data = _catalogue(tmp_path / "data")
    (tmp_path / "first.txt").write_text("b\n")
    result = runner.invoke(app, ["enrich", "--data-dir", str(data), "--backend", "http", "--url", chat_server.url,
                                 "--model", "m", "--first", str(tmp_path / "first.txt"),
                                 "--cache-dir", str(tmp_path / "c")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "2 of 2 items with a record" in result.output
    assert pl.read_parquet(data / "item_metadata.parquet")["item_id"].to_list() == ["b", "a"]  # --first first


def bad_inputs(tmp: Path) -> list[tuple[str, list[str], str]]:
    """(case, options, what the message says): each an input the user can fix (also replayed by
    benchmarks.reliability)."""
    good = _catalogue(tmp / "good")
    (tmp / "a-file").write_text("not a directory")
    (tmp / "empty").mkdir()
    (tmp / "garbage").mkdir()
    (tmp / "garbage" / "items.parquet").write_bytes(bytes(range(256)) * 16)
    (tmp / "int-ids").mkdir()
    pl.DataFrame({"item_idx": [1], "item_id": [7], "title": ["Acme Lip Balm"]}).write_parquet(
        tmp / "int-ids" / "items.parquet"
    )
    (tmp / "binary.txt").write_bytes(bytes(range(256)))
    (tmp / "not-sqlite").mkdir()
    (tmp / "not-sqlite" / "enrich-cache.sqlite").write_bytes(b"SQLite format 2\x00" + bytes(range(256)) * 8)
    (tmp / "records.parquet").write_bytes(b"PAR1" + bytes(range(256)))
    return [
        ("--data-dir missing", ["--data-dir", str(tmp / "missing")], "missing: no such directory"),
        ("--data-dir a file", ["--data-dir", str(tmp / "a-file")], "a-file: not a directory"),
        ("--data-dir empty", ["--data-dir", str(tmp / "empty")], "a directory without items.parquet"),
        ("garbage items.parquet", ["--data-dir", str(tmp / "garbage")], "not a readable parquet file"),
        ("integer item ids", ["--data-dir", str(tmp / "int-ids")], "'item_id' column is Int64, not text"),
        ("--first binary", ["--data-dir", str(good), "--first", str(tmp / "binary.txt")], "not UTF-8 text (byte 128"),
        ("cache not SQLite", ["--data-dir", str(good), "--cache-dir", str(tmp / "not-sqlite")],
         "cannot be opened as an enrich cache"),
        ("--records garbage", ["--data-dir", str(good), "--records", str(tmp / "records.parquet")],
         "records.parquet: not a readable parquet file"),
        ("--timeout-s 0", ["--data-dir", str(good), "--timeout-s", "0"], "timeout_s > 0"),
        ("--device banana", ["--data-dir", str(good), "--backend", "local", "--device", "banana"],
         "enrich device 'banana' is not a device"),
        ("--threads 0", ["--data-dir", str(good), "--threads", "0"], "Invalid value for '--threads'"),
    ]  # fmt: skip


def test_inputs_the_user_can_fix_exit_2_with_the_fix(tmp_path: Path) -> None:
    server = closed_port_url()  # nothing may be asked: each input is refused before
    for case, options, says in bad_inputs(tmp_path):
        result = runner.invoke(app, ["enrich", "--backend", "http", "--url", server, "--model", "m",
                                     "--cache-dir", str(tmp_path / "cache"), *options])  # fmt: skip
        assert result.exit_code == 2, (case, result.output, result.exception)
        usage = case == "--threads 0"  # typer's own check of the option: its usage message
        assert says in result.output and ("Fix: " in result.output or usage), (case, result.output)
        assert "Traceback" not in result.output


def test_records_that_cannot_be_written_exit_2_and_keep_the_answers(chat_server: ChatServer, tmp_path: Path) -> None:
    data = _catalogue(tmp_path / "data")
    (data / "item_metadata.parquet").mkdir()  # in the way: the records cannot take its place
    command = ["enrich", "--data-dir", str(data), "--backend", "http", "--url", chat_server.url, "--model", "m",
               "--cache-dir", str(tmp_path / "c")]  # fmt: skip
    result = runner.invoke(app, command)
    assert result.exit_code == 2 and "item_metadata.parquet: cannot be written" in result.output, result.output
    (data / "item_metadata.parquet").rmdir()
    assert "2 of 2 items with a record" in runner.invoke(app, command).output and chat_server.requests == 2


def test_an_outage_exits_2_and_says_how_to_go_on(tmp_path: Path) -> None:
    data = _catalogue(tmp_path / "data")
    result = runner.invoke(app, ["enrich", "--data-dir", str(data), "--backend", "http", "--url", closed_port_url(),
                                 "--model", "m", "--cache-dir", str(tmp_path / "c")])  # fmt: skip
    assert result.exit_code == 2 and "error: enrich stopped: " in result.output and "ConnectError" in result.output
    assert "run the same command again: it asks only for the 2 items still missing" in result.output


def test_a_trickling_answer_is_cut_at_timeout_s_and_asked_again(chat_server: ChatServer, tmp_path: Path) -> None:
    chat_server.misbehaviour, chat_server.every, chat_server.trickle_s = "trickle", 3, 1.0  # a byte a second
    data = _catalogue(tmp_path / "data")
    began = time.monotonic()
    result = runner.invoke(app, ["enrich", "--data-dir", str(data), "--backend", "http", "--url", chat_server.url,
                                 "--model", "m", "--timeout-s", "1", "--cache-dir", str(tmp_path / "c")])  # fmt: skip
    assert result.exit_code == 0 and "2 of 2 items with a record" in result.output, result.output
    assert time.monotonic() - began < 15 and chat_server.requests == 3


def test_the_cache_goes_to_the_users_cache_directory(
    chat_server: ChatServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _catalogue(tmp_path / "data")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.delenv("RECSYS_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    command = ["enrich", "--data-dir", str(data), "--backend", "http", "--url", chat_server.url, "--model", "m"]
    result = runner.invoke(app, command)
    assert result.exit_code == 0 and "items/s" in result.output, result.output
    assert (tmp_path / "xdg" / "recsys" / "enrich" / "enrich-cache.sqlite").is_file()
    assert list((tmp_path / "cwd").iterdir()) == []  # nothing lands in the current directory
    monkeypatch.setenv("RECSYS_CACHE_DIR", str(tmp_path / "mine"))
    assert runner.invoke(app, command).exit_code == 0
    assert (tmp_path / "mine" / "enrich" / "enrich-cache.sqlite").is_file()
