"""`recsys enrich`: options it cannot use are refused with exit 2 before any model is loaded; a run over an
OpenAI-compatible server writes the catalogue's records (the server: tests/recsys/enrich/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
from typer.testing import CliRunner

from cli import app
from tests.chat_server import ChatServer

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
