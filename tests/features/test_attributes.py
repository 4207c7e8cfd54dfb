"""Item attribute files named in the config: read through the pipeline's prepare step, joined onto the prepared
items, checked like every input (a bad row names its file, line and fix; nothing is written), their ids outside the
data counted and named, and their content part of the step's fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from pipelines.config import DataSection, load_config
from pipelines.data import data_fingerprint, prepare_step
from recsys.data.prepared import load_prepared
from recsys.data.schema import ITEMS_FILE, META_FILE
from recsys.errors import ConfigError, DataError

SEQUENCES = "u1 a b c d\nu2 b c d e\nu3 a c e b\n"
CATEGORIES = (
    "item_id,categories\n"
    "a,Beauty > Makeup > Nails > Nail Polish\n"
    'b,"Beauty > Hair Care > Styling Products > Creams, Gels & Lotions"\n'
    "c,Beauty > Skin Care\n"
    "zz,Beauty > Fragrance\n"  # not in the data
    "d,Beauty > Skin Care > Face\n"
)
NAMES = "item_id,title\na,red nail polish\nb,styling cream\ne,face mask\nyy,unknown thing\n"


def folder(tmp_path: Path) -> Path:
    data = tmp_path / "amazon-toy"
    data.mkdir()
    (data / "user_sequence.txt").write_text(SEQUENCES)
    (data / "item_categories.csv").write_text(CATEGORIES)
    return data


def section(tmp_path: Path, data: Path, attributes: dict[str, str] | None) -> DataSection:
    config = {"name": "toy", "data": {"source": "amazon-p5", "path": str(data)}}
    if attributes is not None:
        config["data"]["attributes"] = attributes  # type: ignore[index]
    path = tmp_path / "toy.yaml"
    path.write_text(json.dumps(config))
    return load_config(path).data


def test_attribute_files_are_joined_onto_the_prepared_items(tmp_path: Path) -> None:
    data = folder(tmp_path)
    names = tmp_path / "elsewhere" / "names.csv"  # outside the input directory: named by its own path
    names.parent.mkdir()
    names.write_text(NAMES)
    out = prepare_step(
        section(tmp_path, data, {"categories": "item_categories.csv", "names": str(names)}), tmp_path / "p"
    )

    items = pl.read_parquet(out / ITEMS_FILE)
    assert items.schema["category_path"] == pl.List(pl.String)
    assert items.select("item_id", "category_path", "name").rows() == [
        ("a", ["Beauty", "Makeup", "Nails", "Nail Polish"], "red nail polish"),
        ("b", ["Beauty", "Hair Care", "Styling Products", "Creams, Gels & Lotions"], "styling cream"),
        ("c", ["Beauty", "Skin Care"], None),
        ("d", ["Beauty", "Skin Care", "Face"], None),
        ("e", None, "face mask"),
    ]
    meta = json.loads((out / META_FILE).read_text())["attributes"]
    assert meta["categories"]["file"] == (data / "item_categories.csv").as_posix()
    assert (meta["categories"]["rows"], meta["categories"]["items_with_value"]) == (5, 4)
    assert meta["categories"]["unknown_items"] == {"count": 1, "examples": [{"line": 5, "item_id": "zz"}]}
    assert meta["names"]["unknown_items"] == {"count": 1, "examples": [{"line": 5, "item_id": "yy"}]}
    assert load_prepared(out).num_items == 5  # the directory reads as before


def test_a_data_set_without_attribute_files_prepares_and_fingerprints_as_before(tmp_path: Path) -> None:
    data = folder(tmp_path)
    plain = section(tmp_path, data, None)
    assert "attributes" not in data_fingerprint(plain)["settings"]  # directories prepared before are still current
    out = prepare_step(plain, tmp_path / "p")
    assert pl.read_parquet(out / ITEMS_FILE).columns == ["item_idx", "item_id", "title", "is_cold", "domain"]
    assert "attributes" not in json.loads((out / META_FILE).read_text())


def test_a_changed_attribute_file_prepares_the_data_again(tmp_path: Path) -> None:
    data = folder(tmp_path)
    names = tmp_path / "names.csv"  # outside the input directory, whose files the fingerprint already hashed
    names.write_text(NAMES)
    config = section(tmp_path, data, {"names": str(names)})
    out = prepare_step(config, tmp_path / "p")
    first = (out / ITEMS_FILE).stat().st_mtime_ns
    prepare_step(config, out)
    assert (out / ITEMS_FILE).stat().st_mtime_ns == first, "an unchanged file prepared again"
    names.write_text(NAMES.replace("face mask", "clay face mask"))
    prepare_step(config, out)
    assert pl.read_parquet(out / ITEMS_FILE).filter(pl.col("item_id") == "e")["name"].item() == "clay face mask"


BAD_ROWS = [
    (
        "item_id,categories\na,Beauty\na,Beauty > Skin Care\n",
        "line 3: item id 'a' appears on line 2 and again on line 3",
    ),
    ("item_id,categories\na,Beauty\nb,\n", "line 3: categories is missing or empty"),
    (
        "item_id,categories\na,Beauty >  > Nails\n",
        "line 2: category path 'Beauty >  > Nails' of item 'a' has an empty level",
    ),
    ("item_id,categories\na,Beauty > \n", "line 2: category path 'Beauty >' of item 'a' has an empty level"),
    (
        "item_id,categories\na,Beauty>Makeup\n",
        "line 2: category path 'Beauty>Makeup' of item 'a' has a '>' without spaces",
    ),
    ("item_id,categories\na," + " > ".join("L" * 9) + "\n", "line 2: category path of item 'a' has 9 levels, over 8"),
    ("item_id,categories\na,Beauty > " + "x" * 201 + "\n", "line 2: a level of item 'a'"),
    (
        "item_id,categories\na,Beauty\n" + "b," + "x" * 2001 + "\n",
        "line 3: categories of item 'b' has 2,001 characters",
    ),
    ("item,categories\na,Beauty\n", "line 1: header ['item', 'categories'] is not item_id and one categories column"),
    ('item_id,categories\na,"Beauty\n', "line 2: unbalanced quotes"),
    ("item_id,categories,extra\na,Beauty,x\n", "line 1: header"),
]


@pytest.mark.parametrize(("text", "message"), BAD_ROWS, ids=range(len(BAD_ROWS)))
def test_a_bad_row_names_its_file_line_and_fix_and_nothing_is_written(tmp_path: Path, text: str, message: str) -> None:
    data = folder(tmp_path)
    (data / "item_categories.csv").write_text(text)
    with pytest.raises(DataError) as caught:
        prepare_step(section(tmp_path, data, {"categories": "item_categories.csv"}), tmp_path / "p")
    assert f"item_categories.csv, {message}" in str(caught.value)
    assert "Fix:" in str(caught.value)
    assert not (tmp_path / "p").exists()


def test_bytes_that_are_not_utf8_and_a_missing_file_are_named(tmp_path: Path) -> None:
    data = folder(tmp_path)
    (data / "item_categories.csv").write_bytes(b"item_id,categories\na,Beaut\xff\n")
    config = section(tmp_path, data, {"categories": "item_categories.csv"})
    with pytest.raises(DataError, match=r"item_categories\.csv, line 2: bytes ff .* not valid UTF-8"):
        prepare_step(config, tmp_path / "p")
    with pytest.raises(DataError, match=r"names\.csv: the names attribute file does not exist\. Fix"):
        prepare_step(section(tmp_path, data, {"names": "names.csv"}), tmp_path / "p")


def test_an_attribute_kind_the_data_layer_does_not_read_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data\.attributes\.colors"):
        section(tmp_path, folder(tmp_path), {"colors": "colors.csv"})
