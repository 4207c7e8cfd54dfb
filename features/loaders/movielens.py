"""MovieLens ratings: `ratings.dat` (ML-1M/10M) or `ratings.csv` (ML-20M/25M/latest), + optional movies file.

- `ratings.dat`: `UserID::MovieID::Rating::Timestamp`, no header.
- `ratings.csv`: header `userId,movieId,rating,timestamp`, unquoted: a quote character in a field is an error (a
  stray or unbalanced quote would otherwise make `"1` a user of its own).
- `movies.dat`: `MovieID::Title::Genres` (GroupLens ships ML-1M's in Latin-1: decoded as UTF-8
  when valid, else as Latin-1 with a warning in the log).
- `movies.csv`: quoted CSV with header `movieId,title,genres`.

value = rating (finite), event = "rating", ts = the unix timestamp (0..`MAX_TIMESTAMP`, as the API takes it, else
an error naming the line); items' category = genres as in the file
("Animation|Children's|Comedy").

Example:
    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "ratings.dat").write_text("1::10::4::978300760\\n")
    >>> load_movielens(folder).interactions.rows()
    [('1', '10', 978300760, 'rating', 4.0, 'movies')]
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from features.io import (
    LINE,
    catalog_frame,
    locate,
    locate_optional,
    parse_numbers,
    read_csv_catalog,
    read_text,
    require_unquoted,
    require_values,
    split_fields,
    text_lines,
)
from features.raw import RawDataset
from recsys.data.schema import DOMAIN, EVENT, ITEM_ID, TITLE, TS, USER_ID, VALUE
from recsys.errors import DataError

SOURCE = "movielens"
DOMAIN_NAME = "movies"
EVENT_NAME = "rating"
DAT_COLUMNS = {"UserID": USER_ID, "MovieID": ITEM_ID, "Rating": VALUE, "Timestamp": TS}  # names of the README
CSV_COLUMNS = {"userId": USER_ID, "movieId": ITEM_ID, "rating": VALUE, "timestamp": TS}
NUMERIC: dict[str, pl.DataType] = {TS: pl.Int64(), VALUE: pl.Float32()}
MOVIE_COLUMNS = {ITEM_ID: ITEM_ID, TITLE: TITLE, "category": "category"}


def load_movielens(path: Path, *, domain: str = DOMAIN_NAME) -> RawDataset:
    """Load MovieLens ratings (+ movies, when beside them) into the canonical schema.

    Args:
        path: `ratings.dat` / `ratings.csv`, or the directory holding one (`.dat` preferred).
        domain: the `domain` of every row.

    Raises:
        DataError: missing/unreadable/empty/non-UTF-8 file, a file other than ratings.dat / ratings.csv, a line
            with the wrong number of fields, a missing header column, a quote character in a ratings field, a rating
            that is not a finite number, a timestamp that is not an integer in 0..MAX_TIMESTAMP, or a movie id listed
            twice.
    """
    ratings = locate(path, ["ratings.dat", "ratings.csv"], SOURCE)
    is_csv = ratings.name.removesuffix(".gz").endswith(".csv")
    columns = CSV_COLUMNS if is_csv else DAT_COLUMNS
    frame = read_ratings_csv(ratings) if is_csv else read_ratings_dat(ratings)
    require_values(frame, ratings, list(columns))
    require_unquoted(frame, ratings, list(columns))
    numbers = {name: NUMERIC[target] for name, target in columns.items() if target in NUMERIC}
    times = [name for name, target in columns.items() if target == TS]
    frame = parse_numbers(frame, ratings, numbers, unix_times=times).rename(columns)
    interactions = frame.select(
        USER_ID, ITEM_ID, TS, pl.lit(EVENT_NAME).alias(EVENT), VALUE, pl.lit(domain).alias(DOMAIN)
    )
    movies = locate_optional(ratings.parent, ["movies.csv" if is_csv else "movies.dat"])
    items = None
    if movies is not None:
        items = read_movies_csv(movies) if is_csv else read_movies_dat(movies)
        items = items.with_columns(pl.lit(domain).alias(DOMAIN))
    files = (ratings,) if movies is None else (ratings, movies)
    return RawDataset(interactions, items, SOURCE, files, lines=frame.get_column(LINE))


def read_ratings_dat(path: Path) -> pl.DataFrame:
    """`UserID::MovieID::Rating::Timestamp` lines -> `line` + those four string columns.

    Args:
        path: the ratings.dat file.
    """
    return split_fields(text_lines(read_text(path)), path, "::", list(DAT_COLUMNS))


def read_ratings_csv(path: Path) -> pl.DataFrame:
    """`userId,movieId,rating,timestamp` CSV (header first) -> `line` + those four string columns.

    Args:
        path: the ratings.csv file.
    """
    lines = text_lines(read_text(path))
    header_line, header_text = lines.row(0)
    header = [name.strip() for name in header_text.split(",")]
    missing = [name for name in CSV_COLUMNS if name not in header]
    if missing:
        raise DataError(
            path,
            f"header {header} lacks column(s) {missing}",
            f"the first line must be the header {','.join(CSV_COLUMNS)}",
            line=header_line,
        )
    rows = split_fields(lines.slice(1), path, ",", header)
    if rows.height == 0:
        raise DataError(path, "no data rows after the header", "pass a file with ratings")
    return rows.select(LINE, *CSV_COLUMNS)


def read_movies_dat(path: Path) -> pl.DataFrame:
    """`MovieID::Title::Genres` lines -> catalog (item_id, title, category).

    Args:
        path: the movies.dat file.
    """
    lines = text_lines(read_text(path, fallback_encoding="latin-1"))
    return catalog_frame(split_fields(lines, path, "::", list(MOVIE_COLUMNS)), path, MOVIE_COLUMNS)


def read_movies_csv(path: Path) -> pl.DataFrame:
    """`movieId,title,genres` quoted CSV -> catalog (item_id, title, category).

    Args:
        path: the movies.csv file.
    """
    return read_csv_catalog(path, {"movieId": ITEM_ID, "title": TITLE, "genres": "category"})
