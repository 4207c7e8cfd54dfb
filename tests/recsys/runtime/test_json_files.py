"""read_json: a JSON file cut short anywhere inside its document says so, whatever value the cut falls in; text that
is wrong where it stops says where."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recsys.errors import DataError
from recsys.runtime.json_files import CUT_SHORT, read_json

SCALARS = st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.floats(allow_nan=False, allow_infinity=False)
VALUES = st.recursive(
    SCALARS | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(document=st.dictionaries(st.text(max_size=6), VALUES, min_size=1, max_size=5), ascii_only=st.booleans(),
       indent=st.sampled_from([None, 2]), cut=st.floats(0.0, 1.0, exclude_max=True))  # fmt: skip
def test_a_document_cut_short_anywhere_is_reported_as_cut_short(
    tmp_path_factory: pytest.TempPathFactory, document: dict, ascii_only: bool, indent: int | None, cut: float
) -> None:
    data = json.dumps(document, ensure_ascii=ascii_only, indent=indent).encode("utf-8")
    path = tmp_path_factory.mktemp("cut") / "report.json"
    path.write_bytes(data[: max(1, int(len(data) * cut))])
    with pytest.raises(DataError, match=r"cut short\?"):
        read_json(path, "write it again")


@pytest.mark.parametrize(
    ("text", "where"),
    [('{"a": 1,, "b": 2}', "line 1, column 9"), ('{"a": trve}', "line 1, column 7"), ('{"a": 1} x', "column 10")],
)
def test_text_wrong_where_it_stops_says_where(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "report.json"
    path.write_text(text)
    with pytest.raises(DataError, match=where) as raised:
        read_json(path, "write it again")
    assert CUT_SHORT not in str(raised.value)
