"""Shared file helpers for the loaders: read, split, parse and check text files with line-accurate errors.

Every loader goes through the same steps, so the same problem gets the same message everywhere:

1. `locate` / `locate_optional` find the input file (a file path, or a directory holding a known name);
   `not_read_by` is the error for an input file a source does not read.
2. `read_text` reads the bytes (gzip by magic number), rejects missing, unreadable or empty files and
   decodes UTF-8 once for the whole file; a bad byte is reported with its line number. `read_line_batches`
   does the same batch by batch (gzip decoded on the fly) for files too large to hold: memory follows the
   batch, and lines, byte offsets and messages are those of the whole-file reading.
3. `text_lines` turns the text into a frame of (line, text), 1-based as an editor shows it; blank lines
   are skipped. `split_fields` / `read_csv_records` / `parse_records` turn lines into fields.
4. `parse_numbers` (numbers that parse, are finite and, for times, lie in 0..`MAX_TIMESTAMP`, the online API's
   bounds), `require_values`, `require_unquoted`, `require_unique` check the fields; `fail_on_first` is the one place
   that turns "the first bad row" into a `DataError` naming file and line.

The `line` column travels with the rows until the loader has checked them, then is dropped.

Example:
    >>> text_lines("u1 a b\\r\\n\\nu2 c\\n").rows()
    [(1, 'u1 a b'), (3, 'u2 c')]
"""

from __future__ import annotations

import ast
import csv
import itertools
import json
import logging
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl

from recsys.data.schema import MAX_TIMESTAMP
from recsys.errors import DataError
from recsys.runtime.progress import Progress

logger = logging.getLogger(__name__)

LINE = "line"  # 1-based line number, carried by parsed frames until the loader has validated them
TEXT = "text"
PARSED = "_parsed"  # a column's value as cast by `parse_numbers`, beside its text while the checks run
GZIP_MAGIC = b"\x1f\x8b"
GZIP_WBITS = 16 + zlib.MAX_WBITS  # zlib reads the gzip header and checks the trailer
READ_BLOCK_BYTES = 16 * 2**20  # a whole file is read in blocks of this size (gunzipped ones too)
UTF8_BOM = b"\xef\xbb\xbf"


def locate(path: Path, names: Sequence[str], source: str) -> Path:
    """The input file: `path` itself if it is one of `names` (or `name.gz`), else the first of them inside it.

    Args:
        path: one of the files, or a directory holding one of `names`.
        names: accepted file names, in order of preference.
        source: the source reading them, for errors.
    """
    wanted = " or ".join(names)
    if path.is_file():
        if path.name.removesuffix(".gz") not in names:
            raise not_read_by(path, source, f"{wanted} (or that file itself)")
        return path
    if not path.exists():
        raise DataError(path, "no such file or directory", "check the --input path")
    found = locate_optional(path, names)
    if found is None:
        raise DataError(path, f"directory has no {wanted} (plain or .gz)", f"pass the directory holding {wanted}")
    return found


def not_read_by(path: Path, source: str, holding: str) -> DataError:
    """The error for an input `path` that is a file `source` does not read: it reads a directory holding `holding`.

    Example:
        >>> str(not_read_by(Path("d/items.csv"), "amazon-p5", "user_sequence.txt"))
        'd/items.csv: is a file; source amazon-p5 reads a directory holding user_sequence.txt. Fix: pass the directory'
    """
    return DataError(path, f"is a file; source {source} reads a directory holding {holding}", "pass the directory")


def locate_optional(directory: Path, names: Sequence[str]) -> Path | None:
    """The first of `names` (or `name.gz`) that exists in `directory`, or None (a directory of that name is found:
    reading it fails, rather than the file being skipped).

    Args:
        directory: where to look.
        names: accepted file names, in order of preference.
    """
    for name in names:
        for candidate in (directory / name, directory / f"{name}.gz"):
            if candidate.exists():
                return candidate
    return None


def read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when the file starts with the gzip magic number.

    Args:
        path: the file to read.
    """
    return b"".join(chunk for chunk, _ in read_chunks(path, READ_BLOCK_BYTES))


def read_chunks(path: Path, size: int) -> Iterator[tuple[bytes, int]]:
    """The file's bytes in chunks of at most `size`, gunzipped on the fly when the file starts with the gzip magic
    number, each with how many bytes of the file on disk were read so far (for progress).

    Args:
        path: the file to read.
        size: the largest chunk (>= 1).

    Raises:
        DataError: the file is missing, a directory, unreadable, or corrupt or truncated gzip.
    """
    try:
        file = path.open("rb")
    except FileNotFoundError as err:
        raise DataError(path, "file not found", "check the --input path") from err
    except IsADirectoryError as err:
        raise DataError(
            path, "is a directory, expected a file", "pass the file itself, or rename the directory"
        ) from err
    except PermissionError as err:
        raise DataError(path, "cannot read it: permission denied", f"make it readable (chmod a+r {path})") from err
    with file:
        gzipped = file.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        file.seek(0)
        chunks = _gunzipped(file, size, path) if gzipped else iter(lambda: file.read(size), b"")
        for chunk in chunks:
            yield chunk, file.tell()


def _gunzipped(file: BinaryIO, size: int, path: Path) -> Iterator[bytes]:
    """The decompressed bytes of a gzip file (its members one after another), at most `size` at a time.

    zlib rather than `gzip.GzipFile`, which returns a stream cut inside its trailer without a word: here the file
    must end where a member ends, and every member's CRC and size are checked (a truncated download is an error).
    """
    decompressor, pending, in_member = zlib.decompressobj(GZIP_WBITS), b"", False
    try:
        while True:
            if not pending:
                pending = file.read(size)
                if not pending:
                    break
            in_member = True
            chunk = decompressor.decompress(pending, size)
            pending = decompressor.unconsumed_tail
            while not pending and not decompressor.eof and len(chunk) == size:  # output held back by the limit
                yield chunk
                chunk = decompressor.decompress(b"", size)
            if decompressor.eof:  # a member ends here; another may follow
                pending, in_member = decompressor.unused_data, False
                decompressor = zlib.decompressobj(GZIP_WBITS)
            if chunk:
                yield chunk
    except zlib.error as err:
        raise _corrupt_gzip(path, str(err)) from err
    if in_member:
        raise _corrupt_gzip(path, "the file ends inside the compressed data: truncated?")


def _corrupt_gzip(path: Path, why: str) -> DataError:
    return DataError(path, f"corrupt gzip data ({why})", "re-download or re-compress the file")


def input_size(path: Path) -> int:
    """How many bytes reading `path` yields: its size, or for gzip the size its trailer records (modulo 4 GiB, so at
    least the compressed size is assumed). Known before reading: it sizes the work (and the prepared parts).

    Args:
        path: an existing file.
    """
    size = path.stat().st_size
    with path.open("rb") as file:
        if file.read(len(GZIP_MAGIC)) != GZIP_MAGIC or size < 4:
            return size
        file.seek(-4, 2)
        return max(int.from_bytes(file.read(4), "little"), size)


def read_text(path: Path, *, fallback_encoding: str | None = None) -> str:
    """Read a whole text file (gzip handled) and decode it as UTF-8 in one go.

    Args:
        path: the file to read.
        fallback_encoding: if given, decode with this when UTF-8 fails (logged); otherwise a
            non-UTF-8 byte is a `DataError` naming its line.

    Raises:
        DataError: the file is missing, unreadable, empty, or not valid UTF-8.
    """
    data = read_bytes(path)
    if not data.strip():
        raise _empty(path)
    return decode_utf8(data.removeprefix(UTF8_BOM), path, fallback_encoding=fallback_encoding)


def read_line_batches(path: Path, batch_bytes: int) -> Iterator[pl.DataFrame]:
    """The non-blank lines of a text file as `text_lines` frames, read, gunzipped and decoded about `batch_bytes` at
    a time, so that memory follows the batch and not the file.

    A batch ends at a line end (a line longer than `batch_bytes` makes a longer batch). Line numbers, byte offsets
    and errors are those of `text_lines(read_text(path))`, except that a problem is found when its batch is read:
    the batches before it have been yielded. Progress (MB read, lines/s, ETA) is logged.

    Args:
        path: the file to read.
        batch_bytes: about how many decoded bytes each batch holds (>= 1).

    Raises:
        DataError: the file is missing, unreadable, corrupt gzip, has no non-blank line, or is not valid UTF-8.
    """
    total_mb = path.stat().st_size / 2**20 if path.is_file() else None
    progress = Progress(logger, f"reading {path}", total=total_mb, unit="MB", rows_are="lines")
    line, offset, rest, at_start, empty, position = 1, 0, b"", True, True, 0
    for chunk, read in itertools.chain(read_chunks(path, batch_bytes), [(b"", None)]):  # b"": the end
        position = read if read is not None else position
        data = rest + chunk
        if at_start:  # a BOM is not part of the first line (and may come in chunks of 1 byte)
            if chunk and len(data) < len(UTF8_BOM):
                rest = data
                continue
            data, at_start = data.removeprefix(UTF8_BOM), False
        end = data.rfind(b"\n") + 1 if chunk else len(data)  # the end keeps a last line without "\n"
        data, rest = data[:end], data[end:]
        if not data:
            continue
        lines = text_lines(decode_utf8(data, path, offset=offset, line=line), first_line=line)
        line += data.count(b"\n")
        offset += len(data)
        progress.update(done=position / 2**20, rows=lines.height)
        if lines.height:
            empty = False
            yield lines
    if empty:
        raise _empty(path)
    progress.finish()


def _empty(path: Path) -> DataError:
    return DataError(path, "file is empty", "pass a file with data, or check that the download finished")


def decode_utf8(
    data: bytes, path: Path, *, offset: int = 0, line: int = 1, fallback_encoding: str | None = None
) -> str:
    """Decode `data` as UTF-8; a bad byte is a `DataError` naming its line and byte offset in the file.

    Args:
        data: whole lines of the file (after a leading BOM).
        path: the file, for errors.
        offset: the byte offset of `data` in the file (after the BOM).
        line: the line number `data` starts on.
        fallback_encoding: if given, decode with this when UTF-8 fails (logged) instead of raising.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad_line = line + data.count(b"\n", 0, err.start)
        if fallback_encoding is not None:
            logger.warning(
                "%s is not UTF-8 (first bad byte on line %d); decoding it as %s",
                path,
                bad_line,
                fallback_encoding,
            )
            return data.decode(fallback_encoding)
        bad = data[err.start : err.end].hex(" ")
        raise DataError(
            path,
            f"bytes {bad} at byte offset {offset + err.start} are not valid UTF-8",
            "re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`",
            line=bad_line,
        ) from err


def text_lines(text: str, *, first_line: int = 1) -> pl.DataFrame:
    """Split text into non-blank lines: columns `line` (1-based, u32) and `text` (no trailing CR).

    Args:
        text: the decoded file contents (or whole lines of it).
        first_line: the line number of the first line of `text`.
    """
    frame = (
        pl.DataFrame({TEXT: [text]})
        .select(pl.col(TEXT).str.split("\n"))
        .explode(TEXT)
        .with_row_index(LINE, offset=first_line)
        .with_columns(pl.col(TEXT).str.strip_chars_end("\r"))
    )
    return frame.filter(pl.col(TEXT).str.strip_chars() != "")


def fail_on_first(
    frame: pl.DataFrame, bad: pl.Expr, path: Path, problem: str | Callable[[dict[str, Any]], str], fix: str
) -> None:
    """Raise a `DataError` for the first row of `frame` where `bad` holds; do nothing if none does.

    Args:
        frame: rows with a `line` column.
        bad: a boolean expression over the frame's columns.
        path: the file the rows came from.
        problem: the problem text, or a function building it from the first bad row (a dict of its columns).
        fix: how to fix it.
    """
    offending = frame.filter(bad)
    if offending.height:
        row = offending.row(0, named=True)
        text = problem if isinstance(problem, str) else problem(row)
        raise DataError(path, text, fix, line=row[LINE])


def split_fields(lines: pl.DataFrame, path: Path, separator: str, names: Sequence[str]) -> pl.DataFrame:
    """Split each line on a literal separator into exactly `len(names)` string fields (stripped).

    Args:
        lines: output of `text_lines`.
        path: the file, for errors.
        separator: literal separator, e.g. "::" or ",".
        names: the field names, in file order.

    Returns:
        columns `line` and one string column per name.
    """
    parts = lines.select(LINE, pl.col(TEXT).str.split(separator).alias("_fields"))
    fail_on_first(
        parts,
        pl.col("_fields").list.len() != len(names),
        path,
        lambda row: (
            f"expected {len(names)} fields ({separator.join(names)}) separated by {separator!r}, "
            f"found {len(row['_fields'])}"
        ),
        "fix or remove the line",
    )
    fields = [pl.col("_fields").list.get(i).str.strip_chars().alias(name) for i, name in enumerate(names)]
    return parts.select(LINE, *fields)


def read_csv_records(text: str, path: Path, columns: Sequence[str]) -> pl.DataFrame:
    """Parse a quoted CSV (header row first), one record per line, with exact line numbers and field counts.

    Catalogs are small (thousands of rows), so they go through Python's `csv` module (strict quoting),
    which knows the line where each record starts; polars' reader would silently pad a short row with
    nulls. A quoted field may hold commas but not a line break: in an item catalog (one title per
    line, as every published one is) a field that runs past the end of its line is an unbalanced quote
    far more often than a two-line title, and reading on would swallow the next records into it. So a
    record over several lines, a quote left open at the end of the file, or a stray quote is a
    `DataError` at the line where the record starts.

    Args:
        text: the decoded file.
        path: the file, for errors.
        columns: columns the header must name; only these are kept.

    Returns:
        `line` plus `columns`, all stripped strings ("" when empty).
    """
    records = _csv_lines(text, path)
    header = [name.strip() for name in next(records)[1]]
    missing = [name for name in columns if name not in header]
    if missing:
        raise DataError(
            path,
            f"header {header} lacks column(s) {missing}",
            f"the header must name {list(columns)}",
            line=1,
        )
    positions = [header.index(name) for name in columns]
    rows: list[list[str]] = []
    lines: list[int] = []
    for line, record in records:
        if any(field.strip() for field in record):
            if len(record) != len(header):
                raise DataError(
                    path,
                    f"expected {len(header)} fields ({','.join(header)}), found {len(record)}",
                    'fix the row; quote fields that contain commas ("a, b")',
                    line=line,
                )
            rows.append([record[i].strip() for i in positions])
            lines.append(line)
    if not rows:
        raise DataError(path, "no data rows after the header", "pass a file with data")
    frame = pl.DataFrame(rows, schema=dict.fromkeys(columns, pl.String()), orient="row")
    return frame.insert_column(0, pl.Series(LINE, lines, dtype=pl.UInt32()))


def _csv_lines(text: str, path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line, fields) of each CSV record, lines 1-based as `text_lines` counts them (split at "\\n" only);
    bad quoting or a record over several lines is a `DataError` naming the line where the record starts."""
    reader = csv.reader((line + "\n" for line in text.split("\n")), strict=True)
    fix = 'close the quote on that line, and double a quote that is part of the text ("")'
    line = 1
    while True:
        try:
            record = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise DataError(path, f"unbalanced quotes ({err})", fix, line=line) from err
        if reader.line_num != line:
            raise DataError(
                path,
                f"a quoted field runs on to line {reader.line_num} (unbalanced quotes?); records are one per line",
                f"{fix}; write a line break inside a field as a space",
                line=line,
            )
        yield line, record
        line += 1


def read_csv_catalog(path: Path, columns: Mapping[str, str]) -> pl.DataFrame:
    """Read a CSV item catalog into canonical columns; the first column is the item id.

    Item ids must be non-empty and unique (a repeated id names both lines); empty text fields become "".

    Args:
        path: the CSV file (header first).
        columns: file column -> canonical column, id first, e.g. {"movieId": "item_id", "title": "title"}.
    """
    records = read_csv_records(read_text(path), path, list(columns))
    return catalog_frame(records, path, columns)


def catalog_frame(records: pl.DataFrame, path: Path, columns: Mapping[str, str]) -> pl.DataFrame:
    """Check and rename parsed catalog rows (with `line`): ids non-empty and unique, then drop `line`.

    Args:
        records: `line` plus the file's columns, as strings.
        path: the file, for errors.
        columns: file column -> canonical column, id first.
    """
    id_column = next(iter(columns))
    require_values(records, path, [id_column])
    require_unique(records, path, id_column, "item id")
    text_columns = [name for name in columns if name != id_column]
    return records.with_columns(pl.col(text_columns).fill_null("")).select(
        [pl.col(source).alias(target) for source, target in columns.items()]
    )


def parse_record(text: str) -> Any:
    """One JSON object per line; falls back to a Python literal (the 2014 Amazon meta files use those).

    Args:
        text: one line.

    Raises:
        ValueError / SyntaxError: neither JSON nor a Python literal.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return ast.literal_eval(text)


def parse_records(lines: pl.DataFrame, path: Path) -> list[tuple[int, dict[str, Any]]]:
    """Parse every line as a JSON object (or Python dict literal), in Python, with line-accurate errors.

    Args:
        lines: output of `text_lines`.
        path: the file, for errors.

    Returns:
        (line, record) pairs.
    """
    records: list[tuple[int, dict[str, Any]]] = []
    for line, text in lines.iter_rows():
        try:
            record = parse_record(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as err:
            raise DataError(path, f"not a JSON object ({err})", "fix or remove the line", line=line) from err
        if not isinstance(record, dict):
            raise DataError(path, f"expected an object, found {type(record).__name__}", "fix the line", line=line)
        records.append((line, record))
    return records


def json_string_fields(lines: pl.DataFrame, path: Path, fields: Sequence[str]) -> pl.DataFrame:
    """Extract scalar fields of one-object-per-line JSON as strings (null when absent).

    Fast path: polars decodes all lines at once. If that fails (a malformed line, a Python literal),
    the lines are parsed one by one in Python, which names the bad line or succeeds.

    Args:
        lines: output of `text_lines`.
        path: the file, for errors.
        fields: the keys to extract.

    Returns:
        columns `line` and one string column per field.
    """
    dtype = pl.Struct(dict.fromkeys(fields, pl.String()))
    try:
        decoded = lines.select(LINE, pl.col(TEXT).str.json_decode(dtype).alias("_record"))
        return decoded.unnest("_record")
    except pl.exceptions.PolarsError:
        logger.info("%s: fast JSON decode failed, parsing line by line", path)
    records = parse_records(lines, path)
    columns: dict[str, list[Any]] = {LINE: [line for line, _ in records]}
    for name in fields:
        columns[name] = [None if rec.get(name) is None else str(rec[name]) for _, rec in records]
    return pl.DataFrame(columns, schema={LINE: pl.UInt32(), **dict.fromkeys(fields, pl.String())})


def parse_numbers(
    frame: pl.DataFrame, path: Path, dtypes: Mapping[str, pl.DataType], *, unix_times: Collection[str] = ()
) -> pl.DataFrame:
    """Cast string columns to numbers, held to what the online API accepts; the first bad value is a `DataError`.

    A value is bad when it does not parse as its dtype, when it is not finite (`nan`, `inf`: a float column), or, in
    a column of `unix_times`, when it lies outside 0..`MAX_TIMESTAMP` (1970-01-01..2100-01-01 in unix seconds; a
    larger one is a unit mistake, milliseconds or nanoseconds). The checks run on the cast column in the one pass
    that casts it.

    Args:
        frame: rows with a `line` column and the string columns to cast.
        path: the file, for errors.
        dtypes: column -> numeric dtype, e.g. {"ts": pl.Int64()}.
        unix_times: the columns of `dtypes` that hold unix seconds.

    Example:
        >>> rows = pl.DataFrame({"line": [1, 2], "ts": ["5", "-5"]})
        >>> parse_numbers(rows, Path("r.dat"), {"ts": pl.Int64()}).get_column("ts").to_list()
        [5, -5]
        >>> parse_numbers(rows, Path("r.dat"), {"ts": pl.Int64()}, unix_times=["ts"])
        Traceback (most recent call last):
        ...
        recsys.errors.DataError: r.dat, line 2: ts -5 is before 1970-01-01: ...
    """
    for name, dtype in dtypes.items():
        checked = frame.with_columns(pl.col(name).cast(dtype, strict=False).alias(PARSED))
        parsed = pl.col(PARSED)
        unparsed = pl.col(name).is_not_null() & parsed.is_null()
        fail_on_first(checked, unparsed, path, _not_a_number(name, dtype), "fix or remove the line")
        if dtype.is_float():
            fail_on_first(
                checked, ~parsed.is_finite(), path, _not_finite(name), f"give a finite {name}, or remove the line"
            )
        if name in unix_times:
            fix = f"give the time in unix seconds, 0..{MAX_TIMESTAMP} (divide milliseconds by 1000); or remove the line"
            fail_on_first(checked, ~parsed.is_between(0, MAX_TIMESTAMP), path, _not_a_unix_time(name), fix)
        frame = checked.with_columns(parsed.alias(name)).drop(PARSED)
    return frame


def require_unquoted(frame: pl.DataFrame, path: Path, columns: Sequence[str]) -> None:
    """No field of `columns` may hold a double quote: in a file whose format has no quoting (MovieLens ratings), a
    quote is a stray or unbalanced one, and reading on would turn `"1` into a user of its own (then dropped by the
    policies as a user with one interaction). One vectorised check over the fields, the first bad row named.

    Args:
        frame: rows with a `line` column and the string columns to check.
        path: the file, for errors.
        columns: the columns read without quoting.

    Example:
        >>> rows = pl.DataFrame({"line": [2], "userId": ['"1'], "movieId": ["2"]})
        >>> require_unquoted(rows, Path("ratings.csv"), ["userId", "movieId"])
        Traceback (most recent call last):
        ...
        recsys.errors.DataError: ratings.csv, line 2: userId '"1' holds a quote character, ...
    """
    quoted = [pl.col(name).str.contains('"', literal=True).fill_null(False) for name in columns]
    fix = "remove the quote characters from the line: the file holds plain ids and numbers, never quoted"
    fail_on_first(frame, pl.any_horizontal(quoted), path, _quoted_field(columns, path), fix)


def require_values(frame: pl.DataFrame, path: Path, columns: Sequence[str]) -> None:
    """Every row must have a non-empty value in each of `columns`.

    Args:
        frame: rows with a `line` column.
        path: the file, for errors.
        columns: the columns that must be filled.
    """
    for name in columns:
        empty = pl.col(name).is_null() | (pl.col(name).cast(pl.String) == "")
        fail_on_first(frame, empty, path, f"{name} is missing or empty", f"give every row a {name}")


def _not_a_number(name: str, dtype: pl.DataType) -> Callable[[dict[str, Any]], str]:
    """The problem text for a value of column `name` that does not parse as `dtype`."""
    kind = "an integer" if dtype.is_integer() else "a number"
    return lambda row: f"{name} {row[name]!r} is not {kind}"


def _not_finite(name: str) -> Callable[[dict[str, Any]], str]:
    """The problem text for a value of column `name` that parses as nan or +-inf (polars casts "1e40" to inf)."""
    return lambda row: f"{name} {row[name]!r} is not a finite number"


def _not_a_unix_time(name: str) -> Callable[[dict[str, Any]], str]:
    """The problem text for a time of column `name` outside 0..MAX_TIMESTAMP."""

    def problem(row: dict[str, Any]) -> str:
        when = "before 1970-01-01" if row[PARSED] < 0 else "after 2100-01-01 (milliseconds or nanoseconds?)"
        return f"{name} {row[PARSED]} is {when}: times are unix seconds in 0..{MAX_TIMESTAMP}, as the API takes them"

    return problem


def _quoted_field(columns: Sequence[str], path: Path) -> Callable[[dict[str, Any]], str]:
    """The problem text for a row of `path` where a field of `columns` holds a quote (the first such field)."""

    def problem(row: dict[str, Any]) -> str:
        name = next(name for name in columns if '"' in (row[name] or ""))
        stray = "a stray or unbalanced quote?"
        return f"{name} {row[name]!r} holds a quote character, but {path.name} is not quoted ({stray})"

    return problem


def require_unique(frame: pl.DataFrame, path: Path, column: str, what: str) -> None:
    """No value of `column` may appear twice; the error names the first line that repeats an earlier one, and that
    earlier line (what a reader going down the file meets first).

    Args:
        frame: rows with a `line` column, in file order.
        path: the file, for errors.
        column: the key that must be unique.
        what: how to call the key in the message, e.g. "user id".
    """
    repeats = frame.filter(~pl.col(column).is_first_distinct())
    if repeats.height:
        key, second = repeats.item(0, column), repeats.item(0, LINE)
        first = frame.filter(pl.col(column) == key).item(0, LINE)
        raise DataError(
            path,
            f"{what} {key!r} appears on line {first} and again on line {second}",
            f"each {what} must appear once: merge or remove one of the lines",
            line=second,
        )
